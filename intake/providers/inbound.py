"""Helpers shared by the inbound-parse providers (Mailgun, Postmark, SendGrid).

`parse_form`: form bodies parsed from the bytes the webhook view read. The
view reads the request body itself (to enforce the size limit), so
Django's `request.POST` is no longer available; and Django would decode a raw
MIME field to text anyway, replacing bytes that are not UTF-8. Here field
values stay bytes, exactly as sent.
"""

import base64
import binascii
import hmac
import quopri
from email import policy
from email.message import Message
from email.parser import BytesHeaderParser
from urllib.parse import parse_qsl

from .base import WebhookRejected


class FormError(ValueError):
    pass


def check_basic_auth(request, secret: str) -> None:
    """Raise WebhookRejected unless the request carries HTTP basic credentials matching `secret`.

    `secret` (what `Mailbox.webhook_secret_ref` resolves to) is `username:password`,
    the credentials written into the webhook URL given to the provider
    (`https://username:password@host/webhooks/postmark/<slug>/`). A secret
    without a colon is a password accepted with any username.
    """
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        raise WebhookRejected("no basic credentials")
    try:
        sent = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookRejected("malformed basic credentials") from None
    sent_user, colon, sent_password = sent.partition(b":")
    if not colon:
        raise WebhookRejected("malformed basic credentials")
    user, has_user, password = secret.partition(":")
    if not has_user:
        user, password = "", secret
    # Both comparisons always run: the timing says nothing about which part was wrong.
    user_ok = hmac.compare_digest(sent_user, user.encode()) if has_user else True
    password_ok = hmac.compare_digest(sent_password, password.encode())
    if not (user_ok and password_ok) or not password:
        raise WebhookRejected("basic credentials do not match")


def _params(header_value: str) -> Message:
    message = Message()
    message["Content-Type"] = header_value
    return message


def parse_form(content_type: str, body: bytes) -> dict[str, bytes]:
    """Fields of a `multipart/form-data` or `application/x-www-form-urlencoded` body (first value wins)."""
    content_type = content_type or ""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        fields: dict[str, bytes] = {}
        for name, value in parse_qsl(body, keep_blank_values=True):
            fields.setdefault(name.decode("utf-8", "replace"), value)
        return fields
    if kind != "multipart/form-data":
        raise FormError(f"unexpected content type {kind or 'none'!r}")
    boundary = _params(content_type).get_param("boundary")
    if not boundary:
        raise FormError("multipart body without a boundary")
    delimiter = b"--" + str(boundary).encode("latin-1")
    fields = {}
    # Everything before the first delimiter is preamble; "--" after the last one closes the body.
    chunks = body.split(delimiter)
    if len(chunks) < 2:
        raise FormError("multipart body without parts")
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            break
        if chunk.startswith(b"\r\n"):
            chunk = chunk[2:]
        elif chunk.startswith(b"\n"):
            chunk = chunk[1:]
        # The line break before the next delimiter belongs to the delimiter.
        if chunk.endswith(b"\r\n"):
            chunk = chunk[:-2]
        elif chunk.endswith(b"\n"):
            chunk = chunk[:-1]
        for separator in (b"\r\n\r\n", b"\n\n"):
            end = chunk.find(separator)
            if end != -1:
                head, value = chunk[:end], chunk[end + len(separator) :]
                break
        else:
            head, value = chunk, b""
        headers = BytesHeaderParser(policy=policy.compat32).parsebytes(head + b"\r\n\r\n")
        disposition = headers.get("Content-Disposition", "")
        name = _params(f"form-data; {disposition.split(';', 1)[1] if ';' in disposition else ''}").get_param("name")
        if not name:
            continue
        encoding = (headers.get("Content-Transfer-Encoding") or "").strip().lower()
        try:
            if encoding == "base64":
                value = base64.b64decode(value)
            elif encoding == "quoted-printable":
                value = quopri.decodestring(value)
        except (binascii.Error, ValueError) as exc:
            raise FormError(f"field {name!r}: undecodable {encoding}") from exc
        fields.setdefault(str(name), value)
    return fields
