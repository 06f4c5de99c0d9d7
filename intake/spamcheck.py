"""Asking rspamd for a spam score: optional, platform-configured, never in the way of the pipeline.

    client = rspamd_from_setting(settings.MAILROOM_RSPAMD_URL, timeout=settings.MAILROOM_RSPAMD_TIMEOUT)
    result = client.check(raw, queue_id="event-42") if client else None   # RspamdResult(9.3, 15.0, "add header")

Most mail reaches Mailroom already scored by the tenant's MTA (the headers `intake.validation.spamscore`
reads). Where it does not (a hosted provider's mailbox, an MTA without a filter) the platform may point
`MAILROOM_RSPAMD_URL` (default "": off) at an rspamd normal worker, e.g. `http://127.0.0.1:11333`.
Normalization then POSTs the stored message to `/checkv2` (rspamd's HTTP protocol: the raw message as
the body; the JSON reply carries `score`, `required_score`, `action`, `is_skipped`) for mail about to
become a ticket, and the higher of that score and the headers' one is stored as `details["spam_score"]`
(source "rspamd"). Like the header score it only decides the acknowledgment.

Failure never stops a message: an unreachable, slow (`MAILROOM_RSPAMD_TIMEOUT` seconds, default 5), erroring
or nonsensical rspamd means no remote score (`check` raises `RspamdUnavailable`; normalization logs it
and goes on). The URL is the platform's, like `MAILROOM_CLAMD`, not a tenant's: it is not put through
the tenant egress guard, and the session ignores proxy variables from the environment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import requests

DEFAULT_TIMEOUT = 5.0
CHECK_PATH = "/checkv2"


class RspamdUnavailable(Exception):
    """rspamd did not give a usable answer (refused, timed out, an HTTP error, not its JSON)."""


@dataclass(frozen=True)
class RspamdResult:
    score: float
    required_score: float | None
    action: str


class RspamdClient:
    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT):
        base = url.rstrip("/")
        self.url = base if base.endswith(CHECK_PATH) else base + CHECK_PATH
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False

    def check(self, raw: bytes, *, queue_id: str = "") -> RspamdResult | None:
        """rspamd's verdict on `raw`; None when rspamd skipped the message. Raises RspamdUnavailable."""
        headers = {"Content-Type": "message/rfc822"}
        if queue_id:
            headers["Queue-Id"] = queue_id[:100]
        try:
            response = self.session.post(self.url, data=raw, headers=headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise RspamdUnavailable(type(exc).__name__) from exc
        if response.status_code != 200:
            raise RspamdUnavailable(f"HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise RspamdUnavailable("reply is not JSON") from exc
        if not isinstance(body, dict):
            raise RspamdUnavailable("reply is not a JSON object")
        if body.get("is_skipped") is True:
            return None
        score = _number(body.get("score"))
        if score is None:
            raise RspamdUnavailable("reply has no score")
        return RspamdResult(
            score=score, required_score=_number(body.get("required_score")), action=str(body.get("action") or "")[:40]
        )

    def close(self) -> None:
        self.session.close()


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return round(float(value), 3)


def rspamd_from_setting(url: str | None, *, timeout: float = DEFAULT_TIMEOUT) -> RspamdClient | None:
    """A client for `MAILROOM_RSPAMD_URL`, or None when it is empty or "off"."""
    url = (url or "").strip()
    if not url or url.lower() == "off":
        return None
    return RspamdClient(url, timeout=timeout)
