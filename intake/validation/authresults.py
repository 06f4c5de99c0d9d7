"""Authentication-Results (RFC 8601): the parser, and the results our own MTA recorded. Pure, no I/O.

    authentication_results(parsed, trusted_authserv_id) -> dict[str, str]

Only the topmost header whose authserv-id is the mailbox's `trusted_authserv_id`
counts; the results inform (risk signals, the acknowledgment), never authorize.
"""
from __future__ import annotations

import re

from ..mime import ParsedMessage

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
    parts, current, quoted = [], [], False
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
    kept if there is one, else the first.
    """
    trusted = (trusted_authserv_id or "").strip().lower()
    if not trusted:
        return {}
    for value in parsed.authentication_results:
        try:
            authserv_id, results = parse_authentication_results(value)
        except Exception:
            continue
        if authserv_id != trusted:
            continue
        out: dict[str, str] = {}
        for method, result, properties in results:
            if method in out and not (result == "pass" and out[method] != "pass"):
                continue
            for key in [k for k in out if k.startswith(method + ".")]:
                del out[key]
            out[method] = result
            for key, prop in properties.items():
                if "." in key:
                    out[f"{method}.{key}"] = prop
        return out
    return {}
