"""Amazon SNS messages to an HTTP(S) subscription: signature verification and subscription confirmation.

Used by the SES provider (`intake.providers.ses`), whose notifications SNS delivers. What makes a
message trusted, in the order checked (cheap and local first, the network last):

1. `Type` is `Notification`, `SubscriptionConfirmation` or `UnsubscribeConfirmation`, and
   `SignatureVersion` is 1 (SHA1withRSA) or 2 (SHA256withRSA).
2. `SigningCertURL` is `https://` and its host matches `MAILROOM_SNS_CERT_HOST_PATTERN`
   (default `^sns\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?$`): the certificate is fetched only from SNS,
   so nobody can sign with a key of their own. Over HTTPS with the system's trust store (or
   `MAILROOM_SNS_CA_BUNDLE`), the TLS connection to that host is what vouches for the certificate.
   The URL is read by urllib3's parser, which is what makes the request (not `urlsplit`, which reads
   `https://attacker.example\\@sns...` as an SNS host that `requests` does not connect to), and refused
   with a backslash, user information, whitespace, a control character, a fragment, a port other than 443
   (outside MAILROOM_EGRESS_ALLOWED_NETWORKS) or another path than SNS's `/SimpleNotificationService-<hex>.pem`.
   `SubscribeURL` follows the same host rule and SNS's shape,
   `/?Action=ConfirmSubscription&TopicArn=<the topic>&Token=<the message's token>`. Both are fetched through
   the egress guard (`intake.egress`), which checks every address at connect time.
3. `TopicArn` is the mailbox's configured topic: SNS signs every topic's messages, anybody's included,
   so only our topic's are ours.
4. `Timestamp` is at most `MAILROOM_SNS_MAX_AGE_SECONDS` old (default one hour, SNS's longest
   HTTP retry window) and not from the future beyond the signature tolerance.
5. The signature, over the canonical string of the type's fields (`key\\nvalue\\n` for each, in
   this order; `Subject` only when present), verifies with the certificate's public key.

The certificate is fetched once per process and URL and cached (SNS rotates it rarely, under a new URL).
A certificate that cannot be fetched is a `TransientError` (the webhook answers 503, and SNS retries
5xx); a message that fails a check is `WebhookRejected` (401: SNS does not retry 4xx, and a forged
message should not be).
"""

import base64
import binascii
import logging
import re
import threading
from datetime import UTC, datetime
from urllib.parse import parse_qs

import requests
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from django.conf import settings

from intake.egress import (
    HTTPS_ONLY,
    HTTPS_PORTS,
    EgressRefused,
    check_url,
    guarded_session,
    is_allow_listed,
    literal_address,
)

from .base import TransientError, WebhookRejected

logger = logging.getLogger(__name__)

NOTIFICATION = "Notification"
SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"
SIGNED_FIELDS = {
    NOTIFICATION: ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    SUBSCRIPTION_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    UNSUBSCRIBE_CONFIRMATION: ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
SIGNATURE_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}
MAX_CERTIFICATE_BYTES = 64 * 1024
MAX_CACHED_CERTIFICATES = 64

_certificates: dict[str, rsa.RSAPublicKey] = {}
_certificates_lock = threading.Lock()


def clear_certificate_cache() -> None:
    with _certificates_lock:
        _certificates.clear()


def string_to_sign(message: dict) -> bytes:
    """The canonical string SNS signs: `name\\nvalue\\n` for each of the type's fields present, in order."""
    fields = SIGNED_FIELDS.get(message.get("Type"))
    if fields is None:
        raise WebhookRejected("unknown SNS message type")
    lines = []
    for name in fields:
        value = message.get(name)
        if value is None:
            if name == "Subject":  # the only optional one
                continue
            raise WebhookRejected(f"SNS message without {name}")
        lines.append(f"{name}\n{value}\n")
    return "".join(lines).encode("utf-8")


CERTIFICATE_PATH = re.compile(r"/SimpleNotificationService-[0-9a-f]+\.pem")
SUBSCRIBE_FIELDS = {"Action", "TopicArn", "Token"}


def check_sns_url(url: str, what: str):
    """`url` parsed (urllib3's `Url`) if it is https:// on an SNS host (MAILROOM_SNS_CERT_HOST_PATTERN) and
    passes the egress guard's reading of it, else WebhookRejected. No DNS here: the fetch checks addresses."""
    try:
        parsed = check_url(str(url or ""), purpose=what, ports=HTTPS_PORTS, schemes=HTTPS_ONLY, resolve=False)
    except EgressRefused as exc:
        raise WebhookRejected(str(exc)) from None
    if not re.fullmatch(settings.MAILROOM_SNS_CERT_HOST_PATTERN, parsed.host or ""):
        raise WebhookRejected(f"{what} is not on an SNS host")
    address = literal_address(parsed.host)
    if parsed.port not in (None, 443) and not (address is not None and is_allow_listed(address)):
        # SNS serves on 443 only; another port only for a stand-in at an allow-listed address (tests).
        raise WebhookRejected(f"{what} is not on port 443")
    return parsed


def check_certificate_url(url: str) -> str:
    parsed = check_sns_url(url, "SigningCertURL")
    if not CERTIFICATE_PATH.fullmatch(parsed.path or "") or parsed.query is not None:
        raise WebhookRejected("SigningCertURL is not an SNS certificate (/SimpleNotificationService-<hex>.pem)")
    return str(url)


def check_subscribe_url(message: dict) -> str:
    url = message.get("SubscribeURL")
    parsed = check_sns_url(url, "SubscribeURL")
    fields = parse_qs(parsed.query or "", keep_blank_values=True, strict_parsing=False)
    shaped = (
        parsed.path == "/"
        and set(fields) == SUBSCRIBE_FIELDS
        and all(len(v) == 1 for v in fields.values())
        and fields["Action"] == ["ConfirmSubscription"]
    )
    if not shaped:
        raise WebhookRejected("SubscribeURL is not SNS's /?Action=ConfirmSubscription&TopicArn=...&Token=...")
    if fields["TopicArn"] != [str(message.get("TopicArn"))] or fields["Token"] != [str(message.get("Token"))]:
        raise WebhookRejected("SubscribeURL names another topic or token than the message")
    return str(url)


def _tls_verify():
    return settings.MAILROOM_SNS_CA_BUNDLE or True


def _session() -> requests.Session:
    return guarded_session(purpose="SNS", ports=HTTPS_PORTS, schemes=HTTPS_ONLY)


def _fetch_certificate(url: str) -> rsa.RSAPublicKey:
    try:
        with (
            _session() as session,
            session.get(
                url,
                timeout=settings.MAILROOM_SNS_TIMEOUT_SECONDS,
                verify=_tls_verify(),
                allow_redirects=False,
                stream=True,
            ) as response,
        ):
            if response.status_code != 200:
                raise TransientError("certificate", f"SNS signing certificate: HTTP {response.status_code}")
            pem = response.raw.read(MAX_CERTIFICATE_BYTES + 1, decode_content=True)
    except EgressRefused as exc:
        raise WebhookRejected(str(exc)) from None
    except requests.RequestException as exc:
        raise TransientError("certificate", f"SNS signing certificate: {type(exc).__name__}") from None
    if len(pem) > MAX_CERTIFICATE_BYTES:
        raise TransientError("certificate", "SNS signing certificate: too large")
    try:
        key = x509.load_pem_x509_certificate(pem).public_key()
    except ValueError:
        raise TransientError("certificate", "SNS signing certificate: not a PEM certificate") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise WebhookRejected("SNS signing certificate does not hold an RSA key")
    return key


def signing_key(url: str) -> rsa.RSAPublicKey:
    """The public key of the certificate at `url` (already checked), fetched once per process."""
    with _certificates_lock:
        key = _certificates.get(url)
    if key is not None:
        return key
    key = _fetch_certificate(url)
    with _certificates_lock:
        if len(_certificates) >= MAX_CACHED_CERTIFICATES:
            _certificates.clear()
        _certificates[url] = key
    logger.info("fetched the SNS signing certificate %s", url)
    return key


def _check_timestamp(value, now: datetime) -> None:
    try:
        sent_at = datetime.fromisoformat(str(value))
    except ValueError:
        raise WebhookRejected("SNS Timestamp is not a date") from None
    if sent_at.tzinfo is None:
        sent_at = sent_at.replace(tzinfo=UTC)
    age = (now - sent_at).total_seconds()
    if age > settings.MAILROOM_SNS_MAX_AGE_SECONDS:
        raise WebhookRejected("SNS message too old")
    if age < -settings.MAILROOM_SIGNATURE_TOLERANCE_SECONDS:
        raise WebhookRejected("SNS message from the future")


def verify(message: dict, topic_arn: str, now: datetime | None = None) -> None:
    """Raise WebhookRejected unless `message` is a genuine SNS message of topic `topic_arn` (module docstring)."""
    if not isinstance(message, dict):
        raise WebhookRejected("not an SNS message")
    canonical = string_to_sign(message)
    hash_class = SIGNATURE_HASHES.get(str(message.get("SignatureVersion")))
    if hash_class is None:
        raise WebhookRejected("unsupported SNS SignatureVersion")
    url = check_certificate_url(message.get("SigningCertURL"))
    if not topic_arn or message.get("TopicArn") != topic_arn:
        raise WebhookRejected("SNS message of another topic")
    _check_timestamp(message.get("Timestamp"), now or datetime.now(UTC))
    try:
        signature = base64.b64decode(str(message.get("Signature") or ""), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRejected("SNS Signature is not base64") from None
    try:
        signing_key(url).verify(signature, canonical, padding.PKCS1v15(), hash_class())
    except InvalidSignature:
        raise WebhookRejected("SNS signature mismatch") from None


def confirm_subscription(message: dict) -> None:
    """Visit the (verified) message's SubscribeURL, itself restricted to SNS hosts: SNS then starts delivering."""
    url = check_subscribe_url(message)
    try:
        with _session() as session:
            response = session.get(
                url, timeout=settings.MAILROOM_SNS_TIMEOUT_SECONDS, verify=_tls_verify(), allow_redirects=False
            )
    except EgressRefused as exc:
        raise WebhookRejected(str(exc)) from None
    except requests.RequestException as exc:
        raise TransientError("subscription", f"SNS SubscribeURL: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise TransientError("subscription", f"SNS SubscribeURL: HTTP {response.status_code}")
