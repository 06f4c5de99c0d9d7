"""The spam score a filter wrote into the message: a risk signal for the acknowledgment. Pure, no I/O.

    spam_score(parsed=parsed) -> SpamScore | None          # SpamScore(7.2, "X-Spam-Status")

Spam scored at or above the mailbox's `spam_score_threshold` (Mailbox.settings, default 5.0, the
SpamAssassin `required_score` default; `MailboxPolicy.spam_score_threshold`) still becomes a ticket,
but is not acknowledged (`spam_score`): many filters only score and leave the verdict to the
delivery agent, so there is no "X-Spam-Flag: YES" to go by. Normalization stores the score in
`InboxEvent.details["spam_score"]` ({"score", "source", "threshold"}).

Headers read (the score, in the order tried):

    X-Spam-Status   SpamAssassin / amavis  "Yes, score=7.2 required=5.0 tests=..." (older: hits=7.2)
    X-Spam-Score    SpamAssassin / amavis  "8.1"
    X-Rspamd-Score  rspamd                 "7.20" or "7.20 / 15.00"
    X-Spamd-Result  rspamd                 "default: False [7.20 / 15.00]; SYMBOL(1.00)[...]"
    X-Spam-Level    SpamAssassin           "*******": one star per whole point (a floor; read last)

Trust: like the spam flags, these headers are believed as the mailbox's MTA leaves them (it
should drop incoming copies; SpamAssassin and rspamd replace their own). A sender who forges a
high score only loses their own acknowledgment; to keep a forged low score from hiding the
filter's real one, the highest score found is taken.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..mime import ParsedMessage

DEFAULT_SPAM_SCORE_THRESHOLD = 5.0
_NUMBER = r"[-+]?\d{1,6}(?:\.\d{1,6})?"
# (header, pattern whose first group is the score); X-Spam-Level is counted, not matched.
SCORE_HEADERS = (
    ("X-Spam-Status", re.compile(rf"\b(?:score|hits)=({_NUMBER})", re.I)),
    ("X-Spam-Score", re.compile(rf"^\s*({_NUMBER})")),
    ("X-Rspamd-Score", re.compile(rf"^\s*({_NUMBER})")),
    ("X-Spamd-Result", re.compile(rf"\[\s*({_NUMBER})\s*/\s*{_NUMBER}\s*\]")),
)
MAX_VALUES = 5  # instances of one header looked at (each relay may add its own)


@dataclass(frozen=True)
class SpamScore:
    score: float
    source: str  # the header it came from

    def as_details(self, threshold: float) -> dict[str, float | str]:
        return {"score": self.score, "source": self.source, "threshold": threshold}


def _values(parsed: ParsedMessage, header: str) -> list[str]:
    message = parsed.email_message
    if message is None:
        return []
    try:
        return [str(v) for v in (message.get_all(header) or [])][:MAX_VALUES]
    except Exception:
        return []


def spam_score(*, parsed: ParsedMessage) -> SpamScore | None:
    """The highest spam score the message's filter headers give, or None when none gives one."""
    found: list[SpamScore] = []
    for header, pattern in SCORE_HEADERS:
        for value in _values(parsed, header):
            match = pattern.search(value)
            if match:
                score = float(match.group(1))
                if math.isfinite(score):
                    found.append(SpamScore(round(score, 3), header))
    for value in _values(parsed, "X-Spam-Level"):
        stars = value.strip()
        if stars and set(stars) == {"*"}:
            found.append(SpamScore(float(len(stars)), "X-Spam-Level"))
    return max(found, key=lambda s: s.score) if found else None


def spam_score_reached(details: dict[str, Any] | None) -> bool:  # an event's JSON details
    """Whether a stored `details["spam_score"]` is at or above the threshold stored with it."""
    stored = (details or {}).get("spam_score")
    if not isinstance(stored, dict):
        return False
    try:
        return float(stored["score"]) >= float(stored.get("threshold", DEFAULT_SPAM_SCORE_THRESHOLD))
    except (KeyError, TypeError, ValueError):
        return False
