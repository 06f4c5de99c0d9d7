"""Which alternative of multipart/alternative to read: the plain text, unless it is a stub.

    html_text_estimate(html) -> int            # cheap guess at the HTML's visible characters
    worth_converting(plain, estimate) -> bool  # could the plain text be a stub? (then convert the HTML)
    is_stub(plain, html_text) -> bool          # the rule, on the converted HTML text

A plain alternative is a stub of the HTML one when
  - it is short (at most `STUB_PHRASE_MAX_CHARS`) and says so ("This message
    is in HTML format", "View this email in your browser", "your mail client
    does not support HTML", ...), and the HTML text is longer; or
  - it is much shorter than the HTML text: under `STUB_RATIO` (40 %) of it,
    and at least `STUB_MIN_DIFFERENCE` (200) characters shorter.
Marketing senders and some web mailers put such stubs in the plain part; the
plain part of ordinary mail holds the same text as the HTML and is kept.

Why the estimate: converting HTML costs ~0.1 ms a KB (`intake.mime.htmltext`) and
most HTML mail carries several times more markup than text, so the HTML is
converted only when a regex count of the characters between tags (after
`</head>`, white space collapsed) leaves room for the plain part to be a
stub, with some slack (`_GATE_RATIO`, `_GATE_DIFFERENCE`) because that count
misses what the converter adds (link addresses, image alt text).
"""

from __future__ import annotations

import re

STUB_RATIO = 0.4
STUB_MIN_DIFFERENCE = 200
STUB_PHRASE_MAX_CHARS = 300
_GATE_RATIO = 0.5
_GATE_DIFFERENCE = 150

_STUB_PHRASES = re.compile(
    r"""
    this\s+(?:e-?mail|message|newsletter)\s+(?:is|was)\s+(?:sent\s+|written\s+|formatted\s+)?in\s+html
  | (?:view|read|see|open)\s+(?:this|the)\s+(?:e-?mail|message|newsletter)\s+
        (?:online|on\s+(?:the|our)\s+web(?:site)?|in\s+(?:a|your)\s+(?:web\s+)?browser)
  | (?:e-?mail|mail)\s+(?:client|program|reader|software)\s+
        (?:does\s*n[o']t|can\s*n[o']t|cannot|is\s+unable\s+to)\s+(?:support|display|show|read)
  | (?:requires|needs)\s+an?\s+html[\s-]+(?:capable|enabled|compatible)
  | im\s+(?:web)?browser\s+(?:anzeigen|ansehen|lesen|\u00f6ffnen)
  | html-format
""",
    re.IGNORECASE | re.VERBOSE,
)
_HEAD_END = re.compile(r"</head\s*>", re.IGNORECASE)
_TAG = re.compile(r"<[^<>]*>")  # not "<[^>]*>": a stray "<" must not make the scan quadratic


def html_text_estimate(html: str) -> int:
    """About how many characters `html_to_text` would give: text between tags after </head>, spaces collapsed."""
    head_end = _HEAD_END.search(html)
    body = html[head_end.end() :] if head_end else html
    return len(" ".join(_TAG.sub(" ", body).split()))


def _says_it_is_a_stub(plain: str) -> bool:
    return len(plain) <= STUB_PHRASE_MAX_CHARS and _STUB_PHRASES.search(plain) is not None


def worth_converting(plain: str, html_estimate: int) -> bool:
    """Whether the HTML must be converted to decide if `plain` is a stub (False: keep the plain text)."""
    chars = len(plain.strip())
    if _says_it_is_a_stub(plain.strip()):
        return html_estimate > chars
    return chars < _GATE_RATIO * html_estimate and html_estimate - chars >= _GATE_DIFFERENCE


def is_stub(plain: str, html_text: str) -> bool:
    """Whether `plain` is a stub of an HTML alternative whose text is `html_text` (see the module docstring)."""
    plain, html_text = plain.strip(), html_text.strip()
    chars, html_chars = len(plain), len(html_text)
    if html_chars <= chars:
        return False
    if _says_it_is_a_stub(plain):
        return True
    return chars < STUB_RATIO * html_chars and html_chars - chars >= STUB_MIN_DIFFERENCE
