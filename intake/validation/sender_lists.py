"""Sender block and allow lists: which entry decides for a sender, and what a block does. Pure, no I/O.

    normalize_pattern(text) -> str                       "Jane@Example.COM" -> "jane@example.com"; ValueError
    lookup_keys(sender) -> list[str]                     the patterns that could match (one indexed query)
    deciding_entry(sender, entries) -> ListEntry | None  the entry that decides, or None
    blocked_verdict(verdict, finding) -> Verdict         a block applied to the validation's verdict

Patterns (`intake.models.SenderListEntry.pattern`, lowercase): an address (`jane@example.com`, compared
without its +tag: `jane+x@example.com` is jane's) or a domain (`@example.com`), which covers its
subdomains too (`mail.example.com`, `a.b.example.com`): senders rotate subdomains far more often than
domains.

Precedence (first wins): the mailbox's list before the tenant's (so an allow on a mailbox's list overrides a
block on the tenant's, and the other way round); within one list the most specific entry (the address,
then the longest domain). One pattern is on a list once, so there is no tie.

Effects (`intake.normalize`): a blocked sender's mail is suppressed (`sender_blocked`, the list and the
entry in the detail), whatever review reason it would otherwise have, but not when it is quarantined
(dangerous content is always seen by security); an allowed sender skips the sender rate limit (and
nothing else: its mail is validated and scanned as anyone's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..domains import normalize_domain, split_address
from ..vocabulary import ReasonCode
from .rules import QUARANTINED, SUPPRESSED, Finding, Verdict

BLOCK, ALLOW = "block", "allow"
TENANT, MAILBOX = "tenant", "mailbox"
MAX_PATTERN_CHARS = 320


@dataclass(frozen=True)
class ListEntry:
    kind: str  # block or allow
    pattern: str
    scope: str  # tenant or mailbox
    entry_id: int | None = None

    @property
    def list_name(self) -> str:
        return f"the {self.scope}'s {self.kind} list"

    def detail(self) -> dict[str, str | int | None]:
        return {"list": self.scope, "kind": self.kind, "pattern": self.pattern, "entry": self.entry_id}


def normalize_pattern(text: str) -> str:
    """The stored form of an admin's entry; ValueError with a clear message when it is neither form."""
    value = (text or "").strip().lower() if isinstance(text, str) else ""
    if not value or len(value) > MAX_PATTERN_CHARS or any(c.isspace() or c in '<>,;"' for c in value):
        raise ValueError("enter an address (jane@example.com) or a domain (@example.com)")
    if value.startswith("@"):
        domain = normalize_domain(value[1:])
        if "." not in domain or "@" in domain or domain.startswith(".") or ".." in domain:
            raise ValueError(f"{text!r} is not a domain: write @example.com")
        return "@" + domain
    local, domain = split_address(value)
    if not local or "." not in domain or "@" in local:
        raise ValueError(f"{text!r} is not an address: write jane@example.com, or @example.com for a domain")
    return f"{local.split('+', 1)[0] or local}@{domain}"


def lookup_keys(sender: str) -> list[str]:
    """The address (without +tag) and each of its domains, most specific first; [] without an address."""
    local, domain = split_address((sender or "").lower())
    if not local or not domain:
        return []
    keys = [f"{local.split('+', 1)[0] or local}@{domain}"]
    labels = domain.split(".")
    keys += ["@" + ".".join(labels[i:]) for i in range(len(labels) - 1)]  # never the bare top-level domain
    return keys


def deciding_entry(sender: str, entries: Iterable[ListEntry]) -> ListEntry | None:
    """The entry that decides for `sender` among `entries` (ListEntry of either scope), or None."""
    keys = lookup_keys(sender)
    rank = {key: n for n, key in enumerate(keys)}
    candidates = [e for e in entries if e.pattern in rank]
    if not candidates:
        return None
    return min(candidates, key=lambda e: (0 if e.scope == MAILBOX else 1, rank[e.pattern]))


def blocked_finding(entry: ListEntry) -> Finding:
    return Finding(SUPPRESSED, ReasonCode.SENDER_BLOCKED, f"sender on {entry.list_name} (entry {entry.pattern})")


def blocked_verdict(verdict: Verdict, finding: Finding) -> Verdict:
    """The block decides, unless the message is quarantined; the other findings stay attached for display."""
    if verdict.state == QUARANTINED:
        return Verdict(verdict.state, verdict.reason_code, verdict.detail, (*verdict.findings, finding))
    return Verdict(SUPPRESSED, finding.reason_code, finding.detail, (finding, *verdict.findings))
