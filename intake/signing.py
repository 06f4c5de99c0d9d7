"""The raw webhook's signature scheme (docs/design.md §2, step 1).

    X-Mailroom-Timestamp: <unix seconds>                      (within the tolerance window)
    X-Mailroom-Signature: v2=<hex HMAC-SHA256(secret, timestamp + "." + message_id + "." + body)>
    X-Mailroom-Message-Id: <message_id>                       (optional; "" in the signature when absent)

v2 covers the message id, so a captured request cannot be replayed under a new id (which
would store it again as a new event). v1 (`v1=<hex HMAC-SHA256(secret, timestamp + "." +
body)>`, the contract's scheme) is still accepted during its deprecation period, with or
without `X-Mailroom-Message-Id`; as v1 does not cover that header, `verify` says so
(`V1_UNSIGNED_ID`) and the webhook answers a second request of the same bytes under another id,
within the tolerance window, as the duplicate of the first (intake.views). Several signatures
may be sent, comma-separated (a secret rotation, or v2 and v1 together).
"""

import hashlib
import hmac
import time

V1 = "v1"
V2 = "v2"
V1_UNSIGNED_ID = "v1-unsigned-id"  # v1 verified, and an X-Mailroom-Message-Id it does not cover was sent


class SignatureError(Exception):
    pass


def _mac(secret: str, prefix: bytes, body: bytes) -> str:
    # The body is fed as it is, never concatenated: a 25 MB message is not copied to be signed.
    mac = hmac.new(secret.encode(), prefix, hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    """The deprecated v1 signature: timestamp and body only."""
    return "v1=" + _mac(secret, str(timestamp).encode() + b".", body)


def sign_v2(secret: str, timestamp: int | str, message_id: str, body: bytes) -> str:
    """The v2 signature: timestamp, `X-Mailroom-Message-Id` ("" when not sent) and body."""
    return "v2=" + _mac(
        secret, str(timestamp).encode() + b"." + message_id.encode("utf-8", "surrogateescape") + b".", body
    )


def verify(
    secret: str,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    tolerance: int,
    now: float | None = None,
    *,
    message_id: str = "",
) -> str:
    """The scheme that verified ("v2", "v1", or V1_UNSIGNED_ID); raises SignatureError otherwise.

    `message_id` is the `X-Mailroom-Message-Id` header as received ("" when absent).
    """
    if not timestamp or not signature:
        raise SignatureError("missing signature headers")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise SignatureError("timestamp is not an integer") from None
    if abs((now if now is not None else time.time()) - sent_at) > tolerance:
        raise SignatureError("timestamp outside the tolerance window")
    candidates = [s.strip() for s in signature.split(",")]
    # Each scheme's MAC is computed only when a signature of that scheme was sent (one HMAC of the body per scheme).
    v2 = [c for c in candidates if c.startswith("v2=")]
    if v2:
        expected = sign_v2(secret, sent_at, message_id, body)
        if any(hmac.compare_digest(expected, c) for c in v2):
            return V2
        # A client that signs with v2 signs its id: a v1 beside it must not vouch for an id the v2 one refutes.
        raise SignatureError("signature mismatch")
    v1 = [c for c in candidates if c.startswith("v1=")]
    if v1:
        expected = sign(secret, sent_at, body)
        if any(hmac.compare_digest(expected, c) for c in v1):
            return V1_UNSIGNED_ID if message_id else V1
    raise SignatureError("signature mismatch")


def signed_headers(secret: str, body: bytes, timestamp: int | None = None, *, message_id: str | None = None) -> dict:
    """Headers a client sends with `body` (v2): used by the mailgate, send_test_email, benchmarks and tests.

    With `message_id`, also the `X-Mailroom-Message-Id` header it signs.
    """
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {"X-Mailroom-Timestamp": str(ts), "X-Mailroom-Signature": sign_v2(secret, ts, message_id or "", body)}
    if message_id:
        headers["X-Mailroom-Message-Id"] = message_id
    return headers
