"""Inbound-parse webhooks (Mailgun, Postmark, SendGrid): signed posts and the provider secrets they use."""

import base64
import hashlib
import hmac
import json
import time
import uuid

MAILGUN_KEY = "key-mailgun-signing"
BASIC_USER, BASIC_PASSWORD = "mailroom", "s3cret-basic"


def multipart(fields: dict) -> tuple[str, bytes]:
    """A multipart/form-data body with byte-exact values, as providers post them."""
    boundary = f"----mailroom{uuid.uuid4().hex}"
    body = b""
    for name, value in fields.items():
        value = value if isinstance(value, bytes) else str(value).encode()
        body += (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n').encode() + value + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def basic(user=BASIC_USER, password=BASIC_PASSWORD) -> dict:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def mailgun_fields(raw: bytes, key=MAILGUN_KEY, timestamp=None, token=None) -> dict:
    timestamp = str(int(time.time()) if timestamp is None else timestamp)
    token = token or uuid.uuid4().hex * 2
    signature = hmac.new(key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256).hexdigest()
    return {
        "recipient": "mailgun@acme.test",
        "timestamp": timestamp,
        "token": token,
        "signature": signature,
        "body-mime": raw,
    }


def post_mailgun(client, fields, url="/webhooks/mailgun/mailgun-box/mime"):
    content_type, body = multipart(fields)
    return client.post(url, data=body, content_type=content_type)


def postmark_payload(raw: bytes | None = None, **extra) -> dict:
    payload = {
        "MessageID": str(uuid.uuid4()),
        "From": "customer@example.com",
        "To": "postmark@acme.test",
        "Subject": "Printer on fire",
        "TextBody": "Please help.\n",
        "MessageStream": "inbound",
        **extra,
    }
    if raw is not None:
        payload["RawEmail"] = raw.decode("utf-8")
    return payload


def post_postmark(client, payload, **headers):
    return client.post(
        "/webhooks/postmark/postmark-box/", data=json.dumps(payload), content_type="application/json", **headers
    )


def post_sendgrid(client, fields, **headers):
    content_type, body = multipart(fields)
    return client.post("/webhooks/sendgrid/sendgrid-box/", data=body, content_type=content_type, **headers)
