"""A stand-in for Amazon SNS's side of an HTTPS subscription, for the SES tests.

    from tests.sns import SNS_TOPIC_ARN, sns_server, ses_notification, signed_sns_message

- `SnsKeys`: an RSA signing key and its self-signed certificate (what SNS serves at `SigningCertURL`),
  and a private CA with a TLS certificate for 127.0.0.1, so the server below speaks real HTTPS that the
  code under test verifies (`MAILROOM_SNS_CA_BUNDLE`).
- `SnsServer`: an HTTPS server on 127.0.0.1 serving the signing certificate and a SubscribeURL, counting
  every request by path (to prove "fetched once" and "refused without fetching").
- `signed_sns_message`: an SNS message (Notification or SubscriptionConfirmation) signed the way SNS
  signs it, SignatureVersion 1 (SHA1withRSA) or 2 (SHA256withRSA), over the canonical string.
- `ses_notification`: the SES "Received" notification (the SNS `Message`) for the SNS or S3 action.

Fixture `sns_server` (starts a server: list it in tests/conftest.py SERVICE_FIXTURES) points
MAILROOM_SNS_CERT_HOST_PATTERN at 127.0.0.1 and MAILROOM_SNS_CA_BUNDLE at the private CA.
"""

import base64
import datetime
import ipaddress
import json
import ssl
import threading
import uuid
from collections import Counter
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SNS_TOPIC_ARN = "arn:aws:sns:eu-west-1:123456789012:mailroom-inbound"
# SNS's own shapes: the certificate at /SimpleNotificationService-<hex>.pem, the confirmation at
# /?Action=ConfirmSubscription&TopicArn=...&Token=... (intake.providers.sns refuses anything else).
CERT_PATH = "/SimpleNotificationService-7506a1e35b36ef5a444dd1a8e7cc3ed8.pem"
CONFIRM_PATH = "/"
SUBSCRIBE_TOKEN = "2336412f37fb687f5d51e6e2425dacbba" * 4
TEST_HOST_PATTERN = r"^127\.0\.0\.1$"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject_key, subject: str, issuer_key, issuer: str, *, ca: bool, san=None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(subject_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


class SnsKeys:
    """The signing key SNS would hold, and the TLS material of the stand-in server."""

    def __init__(self):
        self.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.signing_cert_pem = _pem(
            _certificate(self.signing_key, "sns.amazonaws.com", self.signing_key, "sns.amazonaws.com", ca=False)
        )
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ca_pem = _pem(_certificate(ca_key, "Mailroom test CA", ca_key, "Mailroom test CA", ca=True))
        self.tls_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.tls_cert_pem = _pem(
            _certificate(
                self.tls_key,
                "127.0.0.1",
                ca_key,
                "Mailroom test CA",
                ca=False,
                san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
            )
        )

    @property
    def tls_key_pem(self) -> bytes:
        return self.tls_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


@cache
def sns_keys() -> SnsKeys:
    """One set per test session: RSA key generation is the slow part."""
    return SnsKeys()


# --- messages --------------------------------------------------------------------------------------

SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}


def sns_timestamp(at: datetime.datetime | None = None) -> str:
    at = at or datetime.datetime.now(datetime.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def sign(message: dict, version: int = 2, key=None) -> dict:
    """`message` with its Signature: the canonical string written here independently of the code under test."""
    canonical = "".join(f"{name}\n{message[name]}\n" for name in SIGNED_FIELDS[message["Type"]] if name in message)
    algorithm = hashes.SHA1() if version == 1 else hashes.SHA256()
    signature = (key or sns_keys().signing_key).sign(canonical.encode(), padding.PKCS1v15(), algorithm)
    return {**message, "SignatureVersion": str(version), "Signature": base64.b64encode(signature).decode()}


def signed_sns_message(
    cert_url: str,
    message: str = "",
    kind: str = "Notification",
    version: int = 2,
    topic_arn: str = SNS_TOPIC_ARN,
    timestamp: str | None = None,
    subscribe_url: str = "",
    message_id: str | None = None,
    key=None,
) -> dict:
    body = {
        "Type": kind,
        "MessageId": message_id or str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": timestamp or sns_timestamp(),
        "SigningCertURL": cert_url,
    }
    if kind == "Notification":
        body["Subject"] = "Amazon SES Email Receipt Notification"
        body["UnsubscribeURL"] = cert_url.rsplit("/", 1)[0] + "/unsubscribe"
    else:
        # SNS puts the message's Token into its SubscribeURL: the same here when the URL names one.
        body["Token"] = (parse_qs(urlsplit(subscribe_url).query).get("Token") or [uuid.uuid4().hex * 2])[0]
        body["SubscribeURL"] = subscribe_url
        body["Message"] = f"You have chosen to subscribe to the topic {topic_arn}."
    return sign(body, version=version, key=key)


def ses_notification(
    raw: bytes | None = None,
    action: str = "SNS",
    encoding: str = "BASE64",
    bucket: str = "",
    key: str = "",
    ses_message_id: str | None = None,
) -> str:
    """The SES receipt notification (the SNS `Message`) for one received message."""
    action_body = {"type": action, "topicArn": SNS_TOPIC_ARN}
    notification = {
        "notificationType": "Received",
        "mail": {
            "timestamp": sns_timestamp(),
            "source": "customer@example.com",
            "messageId": ses_message_id or uuid.uuid4().hex,
            "destination": ["support@acme.test"],
            "headersTruncated": False,
        },
        "receipt": {
            "timestamp": sns_timestamp(),
            "processingTimeMillis": 12,
            "recipients": ["support@acme.test"],
            "spamVerdict": {"status": "PASS"},
            "virusVerdict": {"status": "PASS"},
            "spfVerdict": {"status": "PASS"},
            "dkimVerdict": {"status": "PASS"},
            "dmarcVerdict": {"status": "PASS"},
            "action": action_body,
        },
    }
    if action == "SNS":
        action_body["encoding"] = encoding
        notification["content"] = base64.b64encode(raw).decode() if encoding == "BASE64" else raw.decode("utf-8")
    else:
        action_body.update(bucketName=bucket, objectKeyPrefix="", objectKey=key)
    return json.dumps(notification)


# --- the HTTPS server --------------------------------------------------------------------------------


class SnsServer:
    """Serves the signing certificate and a SubscribeURL over HTTPS on 127.0.0.1; counts requests by path."""

    def __init__(self, tmp_path):
        keys = sns_keys()
        self.requests: Counter = Counter()
        self.ca_file = tmp_path / "sns-ca.pem"
        self.ca_file.write_bytes(keys.ca_pem)
        (tmp_path / "sns-tls.pem").write_bytes(keys.tls_cert_pem)
        (tmp_path / "sns-tls.key").write_bytes(keys.tls_key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "sns-tls.pem", tmp_path / "sns-tls.key")
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                path = urlsplit(self.path).path
                server.requests[path] += 1
                if path == CERT_PATH:
                    self._answer(200, keys.signing_cert_pem, "application/x-pem-file")
                elif path == CONFIRM_PATH and "Action=ConfirmSubscription" in self.path:
                    self._answer(200, b"<ConfirmSubscriptionResponse/>", "text/xml")
                else:
                    self._answer(404, b"not found", "text/plain")

            def _answer(self, status, body, content_type):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def cert_url(self) -> str:
        return self.base_url + CERT_PATH

    @property
    def subscribe_url(self) -> str:
        return (
            f"{self.base_url}{CONFIRM_PATH}?Action=ConfirmSubscription&TopicArn={quote(SNS_TOPIC_ARN, safe=':')}"
            f"&Token={SUBSCRIBE_TOKEN}"
        )

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def sns_server(tmp_path, settings):
    """The stand-in, trusted for this test: its host allowed as an SNS host, its CA trusted, the cache empty."""
    from intake.providers import sns

    server = SnsServer(tmp_path).start()
    settings.MAILROOM_SNS_CERT_HOST_PATTERN = TEST_HOST_PATTERN
    settings.MAILROOM_SNS_CA_BUNDLE = str(server.ca_file)
    sns.clear_certificate_cache()
    try:
        yield server
    finally:
        sns.clear_certificate_cache()
        server.stop()
