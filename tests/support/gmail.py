"""Numbered raw messages, one request each with its own Message-ID and Date (Gmail polling, reconciliation)."""


def make_raw(n: int) -> bytes:
    return (
        f"From: Customer {n} <customer{n}@example.com>\r\nTo: support@acme.test\r\n"
        f"Subject: Request {n}\r\nMessage-ID: <request-{n}@example.com>\r\n"
        f"Date: Sun, 29 Nov 2026 10:00:{n % 60:02d} +0000\r\n\r\nPlease help with {n}.\r\n"
    ).encode()
