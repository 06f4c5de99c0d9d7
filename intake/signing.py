"""The raw webhook's signature scheme (docs/design.md §2, step 1).

`X-Mailroom-Signature: v1=<hex HMAC-SHA256(secret, timestamp + "." + body)>`
with `X-Mailroom-Timestamp` within the tolerance window.
"""
import hashlib
import hmac
import time


class SignatureError(Exception):
    pass


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify(secret: str, timestamp: str | None, signature: str | None, body: bytes, tolerance: int,
           now: float | None = None) -> None:
    if not timestamp or not signature:
        raise SignatureError("missing signature headers")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise SignatureError("timestamp is not an integer") from None
    if abs((now if now is not None else time.time()) - sent_at) > tolerance:
        raise SignatureError("timestamp outside the tolerance window")
    expected = sign(secret, sent_at, body)
    # Several signatures may be sent during a secret rotation.
    candidates = [s.strip() for s in signature.split(",")]
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("signature mismatch")


def signed_headers(secret: str, body: bytes, timestamp: int | None = None) -> dict:
    """Headers a client sends with `body`: used by send_test_email, benchmarks and tests."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {"X-Mailroom-Timestamp": str(ts), "X-Mailroom-Signature": sign(secret, ts, body)}
