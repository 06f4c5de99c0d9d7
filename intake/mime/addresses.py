"""Addresses from header values, read leniently but never invented.

    parse_address_list(value) -> list[Mailbox]
    is_valid_address(address, *, allow_dotless=False) -> bool
    is_dotless_address(address) -> bool

Real mail writes address lists every way: RFC 5322 (`"Doe, Jane" <jane@x.com>,
b@y.com`), Outlook's semicolons (`a@x.com; b@y.com`), bare lists separated by
spaces (`a@x.com b@y.com`), display names without quotes or brackets
(`Test test@example.com`), groups (`undisclosed-recipients:;`), comments
(`jane@x.com (Jane)`). The list is split at "," and ";" outside quotes,
comments and angle brackets, and within an entry at whitespace:

- `<...>` is an address; the words before it are its display name;
- without brackets, every word with an "@" outside quotes is an address, and
  the other words are the display name when there is exactly one address;
- an entry with no address at all is kept with `address == ""` (its text is
  the name), so that callers can read `From: MAILER-DAEMON` as what it says.

An RFC 2047 word is one word whatever its text holds (Outlook writes
`=?iso-8859-1?Q?M=FCller,_Andreas?=` with a raw comma: one name, not two
entries); a quoted pair inside a comment (`(Ops \\(24x7\\))`) is a character,
not the comment's end; a domain's trailing dot (`user@example.com.`) is dropped.

Whitespace is only ever removed inside angle brackets next to "@" or "."
(obsolete `<jane @ example.com>`): joining words outside brackets would turn
`Test test@example.com` into the address `Testtest@example.com`.

Names are returned as written (quotes removed, RFC 2047 words not decoded):
decoding is the caller's (it knows the message's charsets). The work is one
regex tokenizer pass, linear in the input; callers cap the input length.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_ADDRESS_CHARS = 254


class Mailbox(NamedTuple):
    name: str  # display name as written, quotes removed; "" if none
    address: str  # as written (not validated); "" when the entry held no address


_SPECIALS = r'\s"(),;:<>\[\]\\'
_TOKEN = re.compile(
    rf"""
    (?P<space>\s+)
  | (?P<encoded>=\?[^?\s"<>]+\?[qQbB]\?[^?"<>]*\?=)
  | (?P<quoted>"(?:[^"\\]|\\.)*"?)
  | (?P<pair>\\.)
  | (?P<literal>\[[^\[\]]*\]?)
  | (?P<atom>[^{_SPECIALS}]+)
  | (?P<special>.)
""",
    re.X | re.S,
)
_QUOTED_PAIR = re.compile(r"\\(.)", re.S)
# The two shapes nearly all headers have, read without the tokenizer.
_BARE_ADDRESS = re.compile(rf"\s*([^{_SPECIALS}@]+@[^{_SPECIALS}@]+)\s*")
_PLAIN_ADDRESS = re.compile(rf"[^{_SPECIALS}@]+@[^{_SPECIALS}@]+")
_PLAIN_NAME = re.compile(r'"[^"\\]*"|[^"(),;:<>\[\]\\@]*')  # one quantifier: no backtracking
_ADDRESS_CHAR = r"[^\x00-\x20\x7f<>()\[\],;:\\\"@]"
_LABEL = r"[^\x00-\x20\x7f<>()\[\],;:\\\"@.'`]+"
_LOCAL_PART = rf"""(?: {_ADDRESS_CHAR}{{1,64}} | "(?:[^"\\\x00-\x1f\x7f]|\\[^\x00-\x1f\x7f]){{1,62}}" )"""
_IP_LITERAL = r"\[ (?: \d{1,3}(?:\.\d{1,3}){3} | IPv6:[0-9A-Fa-f:.]{2,45} ) \]"
_VALID_ADDRESS = re.compile(rf"{_LOCAL_PART} @ (?: (?:{_LABEL}\.)+{_LABEL} | {_IP_LITERAL} )", re.X)
# An intranet name without a dot (root@localhost, alerts@nagios01): deliverable inside a network.
_DOTLESS_ADDRESS = re.compile(rf"{_LOCAL_PART} @ {_LABEL}", re.X)


def is_valid_address(address: str, *, allow_dotless: bool = False) -> bool:
    """Syntactically usable: one "@", a local part (an atom, or a quoted string such as
    `"john smith"`), a domain with a dot (or an IP literal), no control characters, no
    whitespace outside the quotes, at most 254 characters. `allow_dotless`: a domain without a
    dot (an intranet host name) also counts; the parser takes such a sender, flagged in its defects."""
    if not isinstance(address, str) or not 3 <= len(address) <= MAX_ADDRESS_CHARS:
        return False
    if _VALID_ADDRESS.fullmatch(address) is not None:
        return True
    return allow_dotless and _DOTLESS_ADDRESS.fullmatch(address) is not None


def is_dotless_address(address: str) -> bool:
    """An address whose domain is a bare host name (root@localhost): valid only inside a network."""
    return (
        isinstance(address, str)
        and 3 <= len(address) <= MAX_ADDRESS_CHARS
        and _DOTLESS_ADDRESS.fullmatch(address) is not None
    )


def _tidy_address(address: str) -> str:
    """A domain's trailing dot (the root of DNS: user@example.com.) dropped: the same mailbox."""
    if address.endswith(".") and "@" in address and not address.endswith(".."):
        return address[:-1]
    return address


def _unquote(quoted: str) -> str:
    inner = quoted[1:-1] if len(quoted) > 1 and quoted.endswith('"') else quoted[1:]
    return _QUOTED_PAIR.sub(r"\1", inner)


def _angle_address(text: str) -> str:
    # Obsolete CFWS around "@" and "." (<jane @ example.com>) is dropped; other spaces stay (and make
    # the address invalid). Word by word: a regex over a long run of spaces would backtrack.
    pieces: list[str] = []
    for word in text.split():
        if pieces and not (pieces[-1].endswith(("@", ".")) or word.startswith(("@", "."))):
            pieces.append(" ")
        pieces.append(word)
    address = "".join(pieces)
    if address[:7].lower() == "mailto:":
        address = address[7:]
    if address.startswith("@") and ":" in address:  # obsolete source route: <@relay:jane@x.com>
        address = address.rpartition(":")[2]
    return _tidy_address(address)


def _display_name(text: str) -> str:
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] == "'":  # Outlook: 'Bob Smith' <bob@x.com>
        text = text[1:-1].strip()
    return text


def _bare_address(word: str) -> str:
    if len(word) > 2 and word[0] == word[-1] == "'":  # 'jane@x.com', as some clients quote
        word = word[1:-1]
    return _tidy_address(word)


class _Reader:
    """One entry at a time: words (raw, display, has an "@" outside quotes), comments, an angle address."""

    def __init__(self) -> None:
        self.found: list[Mailbox] = []
        self.words: list[tuple[str, str, bool]] = []
        self.comments: list[str] = []
        self.raw: list[str] = []
        self.display: list[str] = []
        self.has_at = False
        self.emitted = False

    def add(self, raw: str, display: str, has_at: bool = False) -> None:
        self.raw.append(raw)
        self.display.append(display)
        self.has_at = self.has_at or has_at

    def end_word(self) -> None:
        if self.raw:
            self.words.append(("".join(self.raw), "".join(self.display), self.has_at))
            self.raw, self.display, self.has_at = [], [], False

    def name(self, words: list[tuple[str, str, bool]]) -> str:
        return _display_name(" ".join(display for _, display, _ in words) or " ".join(self.comments))

    def angle(self, text: str) -> None:
        self.end_word()
        self.found.append(Mailbox(self.name(self.words), _angle_address(text)))
        self.words, self.comments, self.emitted = [], [], True

    def end_entry(self) -> None:
        self.end_word()
        addresses = [raw for raw, _, has_at in self.words if has_at]
        if addresses:
            names = [word for word in self.words if not word[2]]
            name = self.name(names) if len(addresses) == 1 else ""
            self.found.extend(Mailbox(name, _bare_address(raw)) for raw in addresses)
        elif (self.words or self.comments) and not self.emitted:
            self.found.append(Mailbox(self.name(self.words), ""))
        self.words, self.comments, self.emitted = [], [], False


def parse_address_list(value: str) -> list[Mailbox]:
    """Every entry of an address header value, in order (see the module docstring)."""
    if not value:
        return []
    match = _BARE_ADDRESS.fullmatch(value)
    if match:
        return [Mailbox("", _bare_address(match.group(1)))]
    stripped = value.strip()
    if stripped.endswith(">") and stripped.count("<") == 1:  # Name <address>
        name, _, address = stripped[:-1].partition("<")
        name = name.strip()
        if _PLAIN_ADDRESS.fullmatch(address) and _PLAIN_NAME.fullmatch(name):
            return [Mailbox(_display_name(name.strip('"')), _tidy_address(address))]

    reader = _Reader()
    depth = 0  # comment nesting
    comment: list[str] = []
    angle: list[str] | None = None  # text inside "<...>"
    for token in _TOKEN.finditer(value):
        kind, text = token.lastgroup, token.group()
        if depth:
            if kind == "pair":  # "\)" inside a comment is a character, not its end
                comment.append(text[1])
                continue
            if text == "(" and kind == "special":
                depth += 1
            elif text == ")" and kind == "special":
                depth -= 1
                if not depth and angle is None:
                    reader.comments.append(" ".join("".join(comment).split()))
                    continue
            if depth:
                comment.append(text)
            continue
        if angle is not None:
            if kind == "special" and text == ">":
                reader.angle("".join(angle))
                angle = None
            elif kind == "special" and text == "(":
                depth, comment = 1, []
            else:
                angle.append(text)
            continue
        if kind == "space":
            reader.end_word()
        elif kind == "quoted":
            reader.add(text, _unquote(text))
        elif kind == "encoded":  # an RFC 2047 word is one word, whatever its text holds (",", ";", "<")
            reader.add(text, text)
        elif kind == "atom":
            reader.add(text, text, "@" in text)
        elif kind == "literal":
            reader.add(text, text)
        elif text == "(":
            reader.end_word()
            depth, comment = 1, []
        elif text == "<":
            reader.end_word()
            angle = []
        elif text in ",;":
            reader.end_entry()
        elif text == ":" and not any(has_at for _, _, has_at in reader.words) and not reader.has_at:
            # A group ("Team: a@x.com, b@y.com;") or a "mailto:" prefix: the words so far are not names.
            reader.end_word()
            reader.words, reader.comments = [], []
        else:  # stray ")", ">", "\", ":": part of whatever word is being written
            reader.add(text, text)
    if angle is not None:
        reader.angle("".join(angle))
    elif depth:
        reader.comments.append(" ".join("".join(comment).split()))
    reader.end_entry()
    return reader.found
