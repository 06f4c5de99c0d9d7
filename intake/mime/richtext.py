"""Plain text of the old rich text body types: text/enriched (RFC 1896) and text/richtext (RFC 1341).

    enriched_to_text(source) -> str
    richtext_to_text(source) -> str

NeXTMail, Eudora and old Mac clients sent these as the body (often the only one). Formatting
commands are dropped; what a reader saw is kept. text/enriched: "<<" is "<", the contents of
<param> are data for a command, not text; outside <nofill> one line break is a space and n line
breaks in a row are n-1 (so a blank line is a paragraph break); inside <nofill> lines are kept as
written. text/richtext: line breaks are spaces, <nl> is a line break, <np> a page break (shown as a
blank line), <lt> is "<", and <comment> holds no text. One regular-expression pass: linear time.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"<<|<(/?)([A-Za-z0-9-]{1,60})>|\r\n|\r|\n|[^<\r\n]+|<")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_SPACES = re.compile(r" {2,}")


def _tidy(text: str) -> str:
    return _TRAILING_SPACE.sub("\n", text).strip()


def enriched_to_text(source: str) -> str:
    """text/enriched as a reader sees it (see the module docstring)."""
    out: list[str] = []
    nofill = param = pending = 0
    for match in _TOKEN.finditer(source):
        token, name = match.group(0), match.group(2)
        if token[0] in "\r\n":
            if param:
                continue
            if nofill:
                out.append("\n")
            else:
                pending += 1
            continue
        if name is not None:
            step = -1 if match.group(1) else 1
            name = name.lower()
            if name == "param":
                param = max(0, param + step)
            elif name == "nofill":
                nofill = max(0, nofill + step)
            continue
        if param:
            continue
        if pending:
            out.append(" " if pending == 1 else "\n" * (pending - 1))
            pending = 0
        out.append("<" if token == "<<" else token)
    return _tidy("".join(out))


def richtext_to_text(source: str) -> str:
    """text/richtext as a reader sees it (see the module docstring)."""
    out: list[str] = []
    comment = 0
    for match in _TOKEN.finditer(source):
        token, name = match.group(0), match.group(2)
        if name is not None:
            name = name.lower()
            closing = bool(match.group(1))
            if name == "comment":
                comment = max(0, comment + (-1 if closing else 1))
            elif comment:
                continue
            elif name == "lt" and not closing:
                out.append("<")
            elif name == "nl" and not closing:
                out.append("\n")
            elif (name == "np" and not closing) or (name == "paragraph" and closing):
                out.append("\n\n")
            continue
        if comment:
            continue
        if token[0] in "\r\n":
            out.append(" ")
        elif token == "<<":  # not richtext syntax, but what a sender who typed it meant
            out.append("<<")
        else:
            out.append(token)
    text = "\n".join(line.strip(" ") for line in _SPACES.sub(" ", "".join(out)).split("\n"))
    return _tidy(text)
