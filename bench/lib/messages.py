"""The signed messages the benchmarks post, made before the clock starts."""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid

SECRET = "bench-" + uuid.uuid4().hex  # resolved by the app through env:BENCH_SECRET
MAILBOX_SLUG = "bench"
WEBHOOK_PATH = f"/webhooks/raw/{MAILBOX_SLUG}/"

_FILLER = (
    "Hello support team, the printer on the third floor is on fire again and the "
    "extinguisher is out of date. Could someone please look at it today? Thanks.\r\n"
)


def make_body(tag: str, i: int, body_bytes: int) -> bytes:
    """A unique RFC 5322 message (distinct Message-ID) of roughly `body_bytes` bytes."""
    head = (
        f"From: Customer {i} <customer{i}@example.com>\r\n"
        f"To: support@bench.test\r\n"
        f"Subject: [{tag}] request {i}: printer on fire\r\n"
        f"Date: Mon, 06 Jan 2025 10:00:00 +0000\r\n"
        f"Message-ID: <{tag}.{i}@bench.mailroom>\r\n"
        f"MIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Transfer-Encoding: 7bit\r\n\r\n"
    )
    text = (_FILLER * (max(0, body_bytes - len(head)) // len(_FILLER) + 1))[: max(0, body_bytes - len(head))]
    return (head + text).encode()


def sign(body: bytes, timestamp: int) -> str:
    # The documented scheme (intake/signing.py); inlined so that this file needs no Django.
    return "v1=" + hmac.new(SECRET.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()


def make_messages(tag: str, count: int, body_bytes: int) -> list[tuple[bytes, dict]]:
    ts = int(time.time())
    out = []
    for i in range(count):
        body = make_body(tag, i, body_bytes)
        out.append(
            (
                body,
                {
                    "X-Mailroom-Timestamp": str(ts),
                    "X-Mailroom-Signature": sign(body, ts),
                    "Content-Type": "message/rfc822",
                },
            )
        )
    return out
