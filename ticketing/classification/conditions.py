"""A rule's conditions: what each key means, checking them, and matching them against `MessageFacts`.

    validate_conditions(conditions) -> list[str]      error messages; [] when the conditions are usable
    matches(conditions, facts, budget=None) -> bool   every key holds ({} matches every message)

Keys (all given ones must hold):
    recipient            "addr@x" or "@domain", or a list (any of): one of To, Cc, Delivered-To
    sender               "addr@x" or "@domain", or a list (any of): the From address
    subject_regex        a regular expression searched in the subject, case-insensitive
    body_regex           a regular expression searched in the body text, case-insensitive
    keywords             a list of words (any of), case-insensitive, in the subject or the body
    has_attachment_type  a MIME type prefix ("application/pdf", "image/") of an attachment's sniffed type
    auth                 {"dmarc": "pass", "spf": "pass"}: every listed method has that result in the
                         trusted Authentication-Results (our own MTA's); anything else does not match
    is_reply             true / false: the message answers another (In-Reply-To or References)

Regular expressions run through the `regex` package with a timeout: a pattern that backtracks
catastrophically stops after `REGEX_TIMEOUT_SECONDS` (and the whole classification after
`Budget.seconds`), the condition does not match, and the fact is recorded in `Budget.notes` and logged
(the key and rule, never the text).
"""
from __future__ import annotations

import logging
import time

import regex

from .facts import MessageFacts

logger = logging.getLogger(__name__)

KEYS = ("recipient", "sender", "subject_regex", "body_regex", "keywords", "has_attachment_type", "auth",
        "is_reply")
REGEX_KEYS = ("subject_regex", "body_regex")
REGEX_FLAGS = regex.IGNORECASE | regex.VERSION0
REGEX_TIMEOUT_SECONDS = 0.4
CLASSIFICATION_REGEX_SECONDS = 1.0
MAX_PATTERN_CHARS = 1000


class Budget:
    """The regex time one classification may spend, and what went wrong on the way (for the route)."""

    def __init__(self, seconds: float = CLASSIFICATION_REGEX_SECONDS):
        self.deadline = time.monotonic() + seconds
        self.notes: list[str] = []

    def timeout(self) -> float:
        return min(REGEX_TIMEOUT_SECONDS, self.deadline - time.monotonic())

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _addresses(value) -> list[str] | None:
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, str) and "@" in v and v.strip() == v and v for v in values):
        return None
    return [v.lower() for v in values]


def validate_conditions(conditions) -> list[str]:
    """Clear messages for an admin: unknown keys, wrong types, invalid regular expressions."""
    if not isinstance(conditions, dict):
        return ["conditions must be an object ({\"key\": value, ...})"]
    errors = []
    for key, value in conditions.items():
        if key not in KEYS:
            errors.append(f"unknown condition {key!r}; known: {', '.join(KEYS)}")
        elif key in ("recipient", "sender"):
            if _addresses(value) is None:
                errors.append(f"{key}: expected an address (name@example.com), a domain (@example.com) "
                              "or a list of them")
        elif key in REGEX_KEYS:
            if not isinstance(value, str) or not value:
                errors.append(f"{key}: expected a regular expression (a non-empty string)")
            elif len(value) > MAX_PATTERN_CHARS:
                errors.append(f"{key}: the regular expression is longer than {MAX_PATTERN_CHARS} characters")
            else:
                try:
                    regex.compile(value, REGEX_FLAGS)
                except (regex.error, TypeError, ValueError, OverflowError) as exc:
                    errors.append(f"{key}: invalid regular expression: {exc}")
        elif key == "keywords":
            if (not isinstance(value, list) or not value
                    or not all(isinstance(v, str) and v.strip() for v in value)):
                errors.append("keywords: expected a non-empty list of words")
        elif key == "has_attachment_type":
            if not isinstance(value, str) or not value or ("/" not in value and not value.isalpha()):
                errors.append("has_attachment_type: expected a MIME type or prefix (application/pdf, image/)")
        elif key == "auth":
            if (not isinstance(value, dict) or not value
                    or not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items())):
                errors.append('auth: expected {"method": "result"}, for example {"dmarc": "pass"}')
        elif key == "is_reply":
            if not isinstance(value, bool):
                errors.append("is_reply: expected true or false")
    return errors


def _address_matches(patterns: list[str], address: str) -> bool:
    return any(address.endswith(p) if p.startswith("@") else address == p for p in patterns)


def _search(key: str, pattern: str, text: str, budget: Budget, label: str) -> bool:
    timeout = budget.timeout()
    if timeout <= 0:
        budget.note(f"{label}{key}: regex time budget exhausted")
        return False
    try:
        return regex.search(pattern, text, REGEX_FLAGS, timeout=timeout) is not None
    except TimeoutError:
        budget.note(f"{label}{key}: regex timed out")
        logger.warning("classification: %s%s timed out after %.2f s; the condition does not match", label, key,
                       timeout)
        return False
    except (regex.error, TypeError, ValueError, OverflowError) as exc:
        budget.note(f"{label}{key}: invalid regular expression: {exc}")
        return False


def matches(conditions: dict, facts: MessageFacts, budget: Budget | None = None, label: str = "") -> bool:
    """Whether every condition holds. Cheap keys first, so a failing one spares the regular expressions.

    `label` ("rule 7: ") prefixes what is noted in the budget.
    """
    budget = budget or Budget()
    if not isinstance(conditions, dict) or validate_conditions(conditions):
        budget.note(f"{label}invalid conditions: never matches")
        return False
    if "is_reply" in conditions and facts.is_reply is not conditions["is_reply"]:
        return False
    if "recipient" in conditions:
        patterns = _addresses(conditions["recipient"])
        if not any(_address_matches(patterns, r) for r in facts.recipients):
            return False
    if "sender" in conditions and not (facts.sender and _address_matches(_addresses(conditions["sender"]),
                                                                          facts.sender)):
        return False
    if "auth" in conditions:
        for method, result in conditions["auth"].items():
            if facts.auth.get(method.lower()) != result.lower():
                return False
    if "has_attachment_type" in conditions:
        prefix = conditions["has_attachment_type"].lower()
        if not any(t.startswith(prefix) for t in facts.attachment_types):
            return False
    if "keywords" in conditions:
        subject, body = facts.subject.casefold(), facts.body.casefold()
        words = [w.strip().casefold() for w in conditions["keywords"]]
        if not any(w in subject or w in body for w in words):
            return False
    if "subject_regex" in conditions and not _search("subject_regex", conditions["subject_regex"], facts.subject,
                                                     budget, label):
        return False
    if "body_regex" in conditions and not _search("body_regex", conditions["body_regex"], facts.body, budget,
                                                  label):
        return False
    return True
