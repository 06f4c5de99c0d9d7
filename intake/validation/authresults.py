"""Authentication-Results (RFC 8601): the parser, the results a trusted server recorded, and alignment. Pure, no I/O.

    authentication_results(parsed, trusted_authserv_id) -> dict[str, str]
    header_fields(raw) -> [(lowercase name, text)]            # the header block, top first (bounded)
    provider_authentication_results(provider, fields, from_domain=) -> dict[str, str]
    aligned_method(results, from_domain) -> "dmarc" | "dkim" | "spf" | ""
    domains_aligned(a, b) -> bool

Only the topmost header whose authserv-id is the mailbox's `trusted_authserv_id`
counts. The results inform risk signals and decide whether the sender may be
acknowledged (`ticketing.acknowledgments`); they never decide whether a ticket is made.

A mailbox of a hosted provider has that provider's verdict instead (or as well):
Gmail writes `Authentication-Results: mx.google.com; ...`, Amazon SES
`amazonses.com; ...`, Exchange Online (Graph) its header without an authserv-id
(or `*.protection.outlook.com`; only the topmost header counts), each as the
last hop; Mailgun adds `X-Mailgun-Dkim-Check-Result` (believed only when there
is exactly one: a second one was written by the sender) and says nothing about
the domain it checked, so its pass counts only when every DKIM-Signature of the
message names one domain. Its `X-Mailgun-Spf` names no domain that Mailgun
vouches for (the envelope sender is not in the MIME), so it never aligns.

Alignment (DMARC, RFC 7489 §3.1, relaxed): a DMARC pass for the From domain
itself, or an SPF (smtp.mailfrom) or DKIM (header.d) pass for a domain equal to
the From domain or a parent or child of it. Without the Public Suffix List,
sibling subdomains (a.example.com, b.example.com) do not align: stricter than
DMARC, never looser.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from email.parser import BytesParser
from email.policy import compat32

from ..mime import ParsedMessage, decode_header_value
from ..mime.headerblock import repair_header_block

_RESINFO = re.compile(r'([A-Za-z0-9_.-]+)(?:\s*/\s*[0-9]+)?\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


def _without_comments(value: str) -> str:
    out, depth, quoted, escaped = [], 0, False, False
    for char in value:
        if escaped:
            escaped = False
            if depth == 0:
                out.append(char)
            continue
        if char == "\\":
            escaped = True
            if depth == 0:
                out.append(char)
            continue
        if quoted:
            out.append(char)
            if char == '"':
                quoted = False
            continue
        if char == "(":
            depth += 1
        elif char == ")" and depth:
            depth -= 1
        elif depth == 0:
            if char == '"':
                quoted = True
            out.append(char)
    return "".join(out)


def _split_semicolons(value: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_authentication_results(value: str) -> tuple[str, list[tuple[str, str, dict[str, str]]]]:
    """(authserv-id, [(method, result, {ptype.property: value})]) of one header value."""
    segments = _split_semicolons(_without_comments(value[:16384]))
    head = segments[0].split()
    authserv_id = head[0].lower() if head else ""
    if "=" in authserv_id:
        # No authserv-id at all (Exchange Online writes "spf=pass ...; dkim=..."): the first segment is a result.
        authserv_id, segments = "", ["", *segments]
    results = []
    for segment in segments[1:]:
        pairs = [(k.lower(), v.strip('"')) for k, v in _RESINFO.findall(segment)]
        if not pairs:
            continue
        (method, result), properties = pairs[0], dict(pairs[1:])
        results.append((method, result.lower(), properties))
    return authserv_id, results


def authentication_results(parsed: ParsedMessage, trusted_authserv_id: str) -> dict[str, str]:
    """SPF, DKIM, DMARC (and any other method) results our own MTA recorded.

    Only the first (topmost, i.e. most recently added) Authentication-Results
    whose authserv-id equals `trusted_authserv_id` (case-insensitive) is read;
    every other instance may have been written by the sender and is ignored.
    Empty dict when `trusted_authserv_id` is empty or no instance matches.

    Keys: the method ("spf", "dkim", "dmarc", ...) -> its result ("pass",
    "fail", ...), and "<method>.<ptype>.<property>" -> value for the result
    kept (e.g. "dkim.header.d", "spf.smtp.mailfrom", "dmarc.header.from").
    With several results for one method (several DKIM signatures) a "pass" is
    kept if there is one (one aligned with the From domain first), else the first.
    """
    trusted = (trusted_authserv_id or "").strip().lower()
    if not trusted:
        return {}
    return _topmost(
        parsed.authentication_results, lambda authserv_id: authserv_id == trusted, from_domain=domain_of(parsed.sender)
    )


def _topmost(
    values: Iterable[str], believed: Callable[[str], bool], *, from_domain: str, first_only: bool = False
) -> dict[str, str]:
    """The results of the topmost value whose authserv-id `believed` accepts ({} if none).

    `first_only`: only the very first header may be the one (a provider that is always the last hop).
    """
    for value in values:
        try:
            authserv_id, results = parse_authentication_results(value)
        except Exception:
            if first_only:
                return {}
            continue
        if believed(authserv_id):
            return _kept(results, from_domain)
        if first_only:
            return {}
    return {}


def _kept(results: list[tuple[str, str, dict[str, str]]], from_domain: str) -> dict[str, str]:
    def rank(result: str, properties: dict[str, str]) -> int:
        if result != "pass":
            return 0
        return 2 if from_domain and domains_aligned(_result_domain(properties), from_domain) else 1

    out: dict[str, str] = {}
    ranks: dict[str, int] = {}
    for method, result, properties in results:
        score = rank(result, properties)
        if method in out and score <= ranks[method]:
            continue
        for key in [k for k in out if k.startswith(method + ".")]:
            del out[key]
        out[method], ranks[method] = result, score
        for key, prop in properties.items():
            if "." in key:
                out[f"{method}.{key}"] = prop
    return out


def _result_domain(properties: dict[str, str]) -> str:
    """The domain a result speaks for: header.d (DKIM), smtp.mailfrom (SPF), header.from (DMARC), header.i."""
    for key in ("header.d", "smtp.mailfrom", "header.from", "header.i"):
        if properties.get(key):
            return domain_of(properties[key])
    return ""


# --- the header block, and what hosted providers wrote into it --------------------------------------------

MAX_HEADER_FIELDS = 500
MAX_FIELDS_BLOCK = 256 * 1024

# The authserv-id each provider writes its own Authentication-Results under (always the topmost header).
PROVIDER_AUTHSERV_IDS = {"gmail": ("mx.google.com",), "ses": ("amazonses.com",)}
MICROSOFT_AUTHSERV_SUFFIX = ".protection.outlook.com"
PROVIDERS_WITH_VERDICTS = frozenset({"gmail", "graph", "ses", "mailgun"})
_DKIM_DOMAIN = re.compile(r"(?:^|;)\s*d\s*=\s*([^;\s]+)", re.IGNORECASE)


def header_fields(raw: bytes) -> list[tuple[str, str]]:
    """(lowercase name, decoded one-line value) of each header of `raw`, top first; [] if unreadable."""
    raw = bytes(raw or b"")[:MAX_FIELDS_BLOCK]
    try:
        raw = repair_header_block(raw)
        message = BytesParser(policy=compat32).parsebytes(raw, headersonly=True)
        items = message.raw_items()
        return [
            (str(name).strip().lower(), decode_header_value(value if isinstance(value, str) else str(value)))
            for name, value in list(items)[:MAX_HEADER_FIELDS]
        ]
    except Exception:
        return []


def provider_authentication_results(
    provider: str, fields: list[tuple[str, str]], *, from_domain: str = ""
) -> dict[str, str]:
    """What a hosted provider (gmail, graph, ses, mailgun) recorded about the message; {} for any other.

    Same keys as `authentication_results`.
    """
    values = [value for name, value in fields if name == "authentication-results"]
    if provider in PROVIDER_AUTHSERV_IDS:
        ids = PROVIDER_AUTHSERV_IDS[provider]
        return _topmost(values, lambda authserv_id: authserv_id in ids, from_domain=from_domain)
    if provider == "graph":
        # Anyone can write a header without an authserv-id: only the topmost one, Exchange Online's, counts.
        return _topmost(
            values,
            lambda authserv_id: authserv_id == "" or authserv_id.endswith(MICROSOFT_AUTHSERV_SUFFIX),
            from_domain=from_domain,
            first_only=True,
        )
    if provider == "mailgun":
        return _mailgun_results(fields)
    return {}


def _mailgun_results(fields: list[tuple[str, str]]) -> dict[str, str]:
    verdicts = [value for name, value in fields if name == "x-mailgun-dkim-check-result"]
    if len(verdicts) != 1:
        return {}  # none, or one written by the sender next to Mailgun's: no verdict
    result = verdicts[0].strip().lower()
    out = {"dkim": result}
    domains = set()
    for name, value in fields:
        if name == "dkim-signature":
            match = _DKIM_DOMAIN.search(value)
            domains.add(domain_of(match.group(1)) if match else "")
    if result == "pass" and len(domains) == 1 and "" not in domains:
        out["dkim.header.d"] = domains.pop()  # one domain signed: the pass is for that domain
    return out


# --- alignment --------------------------------------------------------------------------------------------


def domain_of(value: str) -> str:
    """The domain of an address, "@domain" or domain (lowercase, no trailing dot); "" if none."""
    value = (value or "").strip().strip("<>").strip()
    return value.rpartition("@")[2].strip().rstrip(".").lower()


def domains_aligned(a: str, b: str) -> bool:
    """Relaxed alignment without the Public Suffix List: equal, or one a subdomain of the other."""
    a, b = domain_of(a), domain_of(b)
    if not a or not b or "." not in a or "." not in b:
        return False
    return a == b or a.endswith("." + b) or b.endswith("." + a)


def aligned_method(results: dict[str, str], from_domain: str) -> str:
    """The method whose pass authenticates `from_domain`: "dmarc", "dkim" or "spf"; "" when none does."""
    from_domain = domain_of(from_domain)
    if not from_domain or not results:
        return ""
    if results.get("dmarc") == "pass":
        evaluated = domain_of(results.get("dmarc.header.from", ""))
        if not evaluated or evaluated == from_domain:
            return "dmarc"
    if results.get("dkim") == "pass" and domains_aligned(
        results.get("dkim.header.d") or results.get("dkim.header.i", ""), from_domain
    ):
        return "dkim"
    if results.get("spf") == "pass" and domains_aligned(results.get("spf.smtp.mailfrom", ""), from_domain):
        return "spf"
    return ""
