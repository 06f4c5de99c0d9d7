"""Helpers that build and sign test messages the way a provider would send them."""

import uuid
from email.message import EmailMessage

from intake.signing import signed_headers


def make_message(
    subject="Printer on fire",
    sender="customer@example.com",
    to="support@acme.test",
    body="Please help.\n",
    message_id=None,
    extra_headers=None,
) -> bytes:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = message_id or f"<{uuid.uuid4()}@test.mailroom>"
    for name, value in (extra_headers or {}).items():
        message[name] = value
    message.set_content(body)
    return message.as_bytes()


def webhook_headers(secret: str, body: bytes, timestamp=None, message_id: str | None = None) -> dict:
    """Headers for Django's test client (HTTP_* keys), signed with v2 (and `X-Mailroom-Message-Id` if given)."""
    headers = signed_headers(secret, body, timestamp, message_id=message_id)
    return {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
