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
                         ("none" also matches a method the trusted results do not mention)
    is_reply             true / false: the message answers another (In-Reply-To or References)
    header               a list of tests, all must hold: {"name": "X-Spam-Score", "op": OP, "value": ...};
                         names case-insensitive, every instance of a repeated header tried (any may hold).
                         OP: exists (no value; false: the header is absent), equals (case-insensitive,
                         whole value), regex (searched), gt / ge / lt / le (the first number of the
                         value, "12.3 (hits)" -> 12.3; a value without one does not match)
    spam_score           {"op": "gt", "value": 8}: the trusted score normalization stored
                         (`intake.validation.spamscore`); no score: does not match
    spam_flagged         true / false: a trusted spam header flagged the message
    attachment_verdict   "clean", "infected", "unscanned", "none" (no attachments) or "unknown" (stored
                         before the verdict was), or a list of them (any of)

Regular expressions run through the `regex` package with a timeout: a pattern that backtracks
catastrophically stops after `REGEX_TIMEOUT_SECONDS` (and the whole classification after
`Budget.seconds`), the condition does not match, and the fact is recorded in `Budget.notes` and logged
(the key and rule, never the text).
"""

from __future__ import annotations

import logging
import math
import time

import regex

from .facts import ATTACHMENT_VERDICTS, MessageFacts

logger = logging.getLogger(__name__)

KEYS = (
    "recipient",
    "sender",
    "subject_regex",
    "body_regex",
    "keywords",
    "has_attachment_type",
    "auth",
    "is_reply",
    "header",
    "spam_score",
    "spam_flagged",
    "attachment_verdict",
)
REGEX_KEYS = ("subject_regex", "body_regex")
REGEX_FLAGS = regex.IGNORECASE | regex.VERSION0
REGEX_TIMEOUT_SECONDS = 0.4
CLASSIFICATION_REGEX_SECONDS = 1.0
MAX_PATTERN_CHARS = 1000
HEADER_OPS = ("exists", "equals", "regex", "gt", "ge", "lt", "le")
NUMERIC_OPS = {"gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}
MAX_HEADER_TESTS = 20
HEADER_NAME = regex.compile(r"[!-9;-~]{1,100}")
FIRST_NUMBER = regex.compile(r"[-+]?(?:\d{1,9}(?:\.\d{1,9})?|\.\d{1,9})")


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


# What people type for the comparisons besides our own words: stored as our words (`canonical_conditions`).
OP_ALIASES = {
    ">": "gt",
    ">=": "ge",
    "<": "lt",
    "<=": "le",
    "=": "equals",
    "==": "equals",
    "eq": "equals",
    "matches": "regex",
    "present": "exists",
}


def _canonical_test(test):
    if not isinstance(test, dict) or not isinstance(test.get("op"), str):
        return test
    return {**test, "op": OP_ALIASES.get(test["op"].strip().lower(), test["op"].strip().lower())}


def canonical_conditions(conditions):
    """`conditions` as they are stored: a single header test as a list of one, "op": ">" as "gt" (and the other
    aliases). What the console and the API save; anything that is not an object is returned as it is."""
    if not isinstance(conditions, dict):
        return conditions
    canonical = dict(conditions)
    if "header" in canonical:
        tests = canonical["header"]
        tests = [tests] if isinstance(tests, dict) else tests
        canonical["header"] = [_canonical_test(t) for t in tests] if isinstance(tests, list) else tests
    if "spam_score" in canonical:
        canonical["spam_score"] = _canonical_test(canonical["spam_score"])
    return canonical


def validate_conditions(conditions) -> list[str]:
    """Clear messages for an admin: unknown keys, wrong types, invalid regular expressions."""
    if not isinstance(conditions, dict):
        return ['conditions must be an object ({"key": value, ...})']
    conditions = canonical_conditions(conditions)  # a row written past the console and the API reads the same
    errors = []
    for key, value in conditions.items():
        if key not in KEYS:
            errors.append(f"unknown condition {key!r}; known: {', '.join(KEYS)}")
        elif key in ("recipient", "sender"):
            if _addresses(value) is None:
                errors.append(
                    f"{key}: expected an address (name@example.com), a domain (@example.com) or a list of them"
                )
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
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
                errors.append("keywords: expected a non-empty list of words")
        elif key == "has_attachment_type":
            if not isinstance(value, str) or not value or ("/" not in value and not value.isalpha()):
                errors.append("has_attachment_type: expected a MIME type or prefix (application/pdf, image/)")
        elif key == "auth":
            if (
                not isinstance(value, dict)
                or not value
                or not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items())
            ):
                errors.append('auth: expected {"method": "result"}, for example {"dmarc": "pass"}')
        elif key in ("is_reply", "spam_flagged"):
            if not isinstance(value, bool):
                errors.append(f"{key}: expected true or false")
        elif key == "header":
            errors.extend(_header_errors(value))
        elif key == "spam_score":
            if (
                not isinstance(value, dict)
                or set(value) != {"op", "value"}
                or value.get("op") not in NUMERIC_OPS
                or not _is_number(value.get("value"))
            ):
                errors.append(
                    'spam_score: expected {"op": "gt" | "ge" | "lt" | "le", "value": a number}, '
                    'for example {"op": "gt", "value": 8}'
                )
        elif key == "attachment_verdict":
            values = value if isinstance(value, list) else [value]
            if not values or not all(v in ATTACHMENT_VERDICTS for v in values):
                errors.append(f"attachment_verdict: expected one of {', '.join(ATTACHMENT_VERDICTS)} or a list of them")
    return errors


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _header_errors(tests) -> list[str]:
    if not isinstance(tests, list) or not tests:
        return ['header: expected a test such as {"name": "X-Spam-Score", "op": "gt", "value": 8}, or a list of them']
    if len(tests) > MAX_HEADER_TESTS:
        return [f"header: at most {MAX_HEADER_TESTS} tests"]
    errors = []
    for n, test in enumerate(tests, start=1):
        where = f"header test {n}"
        if not isinstance(test, dict):
            errors.append(f'{where}: expected {{"name": ..., "op": ..., "value": ...}}')
            continue
        name, op, value = test.get("name"), test.get("op"), test.get("value")
        unknown = set(test) - {"name", "op", "value"}
        if unknown:
            errors.append(f"{where}: unknown keys {', '.join(sorted(map(str, unknown)))}")
        if not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            errors.append(f"{where}: name must be a header name (X-Spam-Score), not {name!r}")
        if op not in HEADER_OPS:
            errors.append(f"{where}: op must be one of {', '.join(HEADER_OPS)}, not {op!r}")
        elif op == "exists":
            if "value" in test and not isinstance(value, bool):
                errors.append(f"{where}: exists takes no value (or true / false)")
        elif op in NUMERIC_OPS:
            if not _is_number(value):
                errors.append(f"{where}: {op} compares with a number, not {value!r}")
        elif not isinstance(value, str) or not value:
            errors.append(f"{where}: {op} needs a non-empty text value")
        elif op == "regex":
            if len(value) > MAX_PATTERN_CHARS:
                errors.append(f"{where}: the regular expression is longer than {MAX_PATTERN_CHARS} characters")
            else:
                try:
                    regex.compile(value, REGEX_FLAGS)
                except (regex.error, TypeError, ValueError, OverflowError) as exc:
                    errors.append(f"{where}: invalid regular expression: {exc}")
    return errors


def first_number(text: str) -> float | None:
    """The first number in a header value ("12.3 (hits)" -> 12.3), or None."""
    match = FIRST_NUMBER.search(text[:200])
    if match is None:
        return None
    number = float(match.group(0))
    return number if math.isfinite(number) else None


def _header_holds(test: dict, facts: MessageFacts, budget: Budget, label: str) -> bool:
    values = facts.header_values(test["name"])
    op = test["op"]
    if op == "exists":
        return bool(values) is test.get("value", True)
    for value in values:
        if op == "equals" and value.strip().casefold() == test["value"].strip().casefold():
            return True
        if op == "regex" and _search(f"header {test['name']}", test["value"], value, budget, label):
            return True
        if op in NUMERIC_OPS:
            number = first_number(value)
            if number is not None and NUMERIC_OPS[op](number, test["value"]):
                return True
    return False


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
        logger.warning("classification: %s%s timed out after %.2f s; the condition does not match", label, key, timeout)
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
    conditions = canonical_conditions(conditions)
    if "is_reply" in conditions and facts.is_reply is not conditions["is_reply"]:
        return False
    if "recipient" in conditions:
        patterns = _addresses(conditions["recipient"])
        if not any(_address_matches(patterns, r) for r in facts.recipients):
            return False
    if "sender" in conditions and not (
        facts.sender and _address_matches(_addresses(conditions["sender"]), facts.sender)
    ):
        return False
    if "auth" in conditions:
        for method, result in conditions["auth"].items():
            found = facts.auth.get(method.lower(), "none")
            if found != result.lower():
                return False
    if "spam_flagged" in conditions and facts.spam_flagged is not conditions["spam_flagged"]:
        return False
    if "spam_score" in conditions:
        test = conditions["spam_score"]
        if facts.spam_score is None or not NUMERIC_OPS[test["op"]](facts.spam_score, test["value"]):
            return False
    if "attachment_verdict" in conditions:
        wanted = conditions["attachment_verdict"]
        if facts.attachment_verdict not in (wanted if isinstance(wanted, list) else [wanted]):
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
    if "subject_regex" in conditions and not _search(
        "subject_regex", conditions["subject_regex"], facts.subject, budget, label
    ):
        return False
    if "body_regex" in conditions and not _search("body_regex", conditions["body_regex"], facts.body, budget, label):
        return False
    # Header tests last: a regex among them spends the same budget.
    return all(_header_holds(test, facts, budget, label) for test in conditions.get("header") or ())
