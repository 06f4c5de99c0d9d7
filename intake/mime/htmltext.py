"""HTML to readable plain text, in linear time, with the standard library only.

`html_to_text(html) -> str` never raises. It drops what a reader never sees
(`<script>`, `<style>`, `<head>`, `<title>`, `<template>`, comments,
declarations), keeps a line break for every block element (paragraphs,
headings, list items, table rows, `<br>`, `<hr>`), unescapes entities
(`html.unescape`), collapses runs of white space the way a browser does
(except inside `<pre>`), writes list items as "- item", puts a link's address
after its text when the two differ ("click here <https://...>"), and an
image's alt text as "[alt]".

Why not `html.parser.HTMLParser`: on this interpreter (3.11.7) it is
quadratic on unclosed markup; 40 KB of "<a <a <a ..." took 17 s, which any
sender could put in a mail. The tokenizer below looks for each "<" and the
next ">" with `str.find`, caching the position of the next ">", so every
character is looked at a bounded number of times. What it gives up: a ">"
inside a quoted attribute value ends the tag early (rare in mail; the rest of
the attribute shows up as text). Raw-text elements (`script`, `style`,
`title`, `textarea`, ...) end at the first matching end tag, as in browsers;
an unclosed comment hides the rest of the document, as in browsers.

It is meant for ticket descriptions, not for rendering: the output is bounded
(`max_chars`), and so is the input it looks at (`max_input_chars`).
"""

import html as _html
import re

MAX_INPUT_CHARS = 1_000_000
MAX_OUTPUT_CHARS = 64 * 1024

# Elements whose content a reader never sees.
_INVISIBLE = frozenset(
    {
        "script",
        "style",
        "head",
        "template",
        "title",
        "noscript",
        "object",
        "svg",
        "math",
        "iframe",
        "noembed",
        "noframes",
    }
)
# Elements whose content is not markup: it ends at the first `</name`.
_RAWTEXT = frozenset({"script", "style", "title", "textarea", "xmp", "iframe", "noembed", "noframes"})
# What may stand inside `<head>`; anything else means the body has begun.
_HEAD_CONTENT = frozenset({"title", "meta", "link", "style", "script", "base", "noscript", "template"})
# Elements that start and end a line of their own.
_BLOCK = frozenset(
    {
        "address",
        "article",
        "aside",
        "body",
        "caption",
        "center",
        "dd",
        "details",
        "dialog",
        "dir",
        "div",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "header",
        "hgroup",
        "html",
        "legend",
        "main",
        "menu",
        "nav",
        "section",
        "summary",
        "tbody",
        "tfoot",
        "thead",
        "tr",
    }
)
# Blocks that deserve an empty line around them.
_PARAGRAPH = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "table", "ul", "ol", "dl"})
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
)
_CELL = frozenset({"td", "th"})

_SPACES = re.compile(r"[ \t\r\n\f\v\u00a0\u200b]+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_LINES = re.compile(r"\n{3,}")
_TAG_NAME = re.compile(r"(/?)([a-zA-Z][^\s/>]*)")
_ATTR = re.compile(r"""([^\s=/>"']+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]*)))?""")
_RAWTEXT_END = {name: re.compile(rf"</{name}(?=[\s/>])", re.IGNORECASE) for name in _RAWTEXT}
# C0 controls other than tab and newline, and DEL: never useful in a ticket, NUL is refused by PostgreSQL.
_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127], None)


class _TextExtractor:
    """Turns tag and text events into lines of text; bounded output."""

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.out: list[str] = []
        self.length = 0
        self.full = False
        self.invisible: list[str] = []  # open invisible elements, innermost last
        self.pre = 0
        self.at_line_start = True
        self.pending_space = False
        self.links: list[str] = []
        self.link_text: list[list[str]] = []

    # -- output --------------------------------------------------------------------
    def _emit(self, text: str) -> None:
        if self.full or not text:
            return
        room = self.max_chars - self.length
        if len(text) >= room:
            text = text[:room]
            self.full = True
        self.out.append(text)
        self.length += len(text)
        self.at_line_start = text.endswith("\n")
        for pieces in self.link_text:
            pieces.append(text)

    def _newline(self, blank: bool = False) -> None:
        self.pending_space = False
        if not self.out:
            return
        tail = self.out[-1]
        if blank:
            if tail.endswith("\n\n"):
                return
            self._emit("\n" if tail.endswith("\n") else "\n\n")
        elif not tail.endswith("\n"):
            self._emit("\n")

    def _text(self, text: str) -> None:
        if self.pre:
            self._emit(text)
            return
        collapsed = _SPACES.sub(" ", text)
        if not collapsed:
            return
        if collapsed == " ":
            self.pending_space = self.pending_space or not self.at_line_start
            return
        if collapsed[0] == " " and not self.at_line_start:
            self.pending_space = True
        body = collapsed.strip(" ")
        if self.pending_space and not self.at_line_start:
            body = " " + body
        self._emit(body)
        self.pending_space = collapsed[-1] == " "

    # -- events ------------------------------------------------------------------------
    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if "head" in self.invisible and tag not in _HEAD_CONTENT:
            # `<head>` left open: the body has begun all the same.
            del self.invisible[self.invisible.index("head") :]
        if tag in _INVISIBLE:
            self.invisible.append(tag)
            return
        if self.invisible:
            return
        if tag == "br":
            self._emit("\n")
            self.pending_space = False
        elif tag == "hr":
            self._newline()
            self._emit("---\n")
        elif tag == "li":
            self._newline()
            self._emit("- ")
            self.pending_space = False
        elif tag in _PARAGRAPH:
            self._newline(blank=True)
            if tag == "pre":
                self.pre += 1
        elif tag in _BLOCK:
            self._newline()
        elif tag in _CELL:
            if not self.at_line_start:
                self.pending_space = True
        elif tag == "img":
            alt = (attrs.get("alt") or "").strip()
            if alt:
                self._text(f" [{alt}] ")
        elif tag == "a" and len(self.links) < 64:
            self.links.append((attrs.get("href") or "").strip())
            self.link_text.append([])

    def end(self, tag: str) -> None:
        if tag in _INVISIBLE:
            if tag in self.invisible:
                # Close it and anything left open inside it.
                del self.invisible[len(self.invisible) - 1 - self.invisible[::-1].index(tag) :]
            return
        if self.invisible:
            return
        if tag in _PARAGRAPH:
            if tag == "pre" and self.pre:
                self.pre -= 1
            self._newline(blank=True)
        elif tag in _BLOCK or tag == "li":
            self._newline()
        elif tag == "a" and self.links:
            href = self.links.pop()
            text = "".join(self.link_text.pop()).strip()
            lowered = href.lower()
            shown = href[7:] if lowered.startswith("mailto:") else href
            if (
                lowered.startswith(("http://", "https://", "mailto:"))
                and shown
                and shown.rstrip("/") != text.rstrip("/")
            ):
                self._emit(f" <{shown}>" if text else f"<{shown}>")

    def data(self, text: str) -> None:
        if not self.invisible and text:
            self._text(_html.unescape(text))

    def rawtext(self, tag: str, text: str) -> None:
        if tag not in _INVISIBLE and not self.invisible:
            self._text(_html.unescape(text))

    def result(self) -> str:
        text = "".join(self.out).translate(_CONTROL)
        text = _TRAILING.sub("\n", text)
        text = _BLANK_LINES.sub("\n\n", text)
        return text.strip()


def _attributes(source: str) -> dict[str, str]:
    attrs = {}
    for match in _ATTR.finditer(source):
        name = match.group(1).lower()
        if name not in attrs:
            value = (
                match.group(2)
                if match.group(2) is not None
                else (match.group(3) if match.group(3) is not None else (match.group(4) or ""))
            )
            attrs[name] = _html.unescape(value)
    return attrs


def _tokenize(source: str, sink: _TextExtractor) -> None:
    n = len(source)
    i = 0
    gt = -1  # position of the next ">" at or after the current "<", once looked up
    while i < n and not sink.full:
        lt = source.find("<", i)
        if lt < 0:
            sink.data(source[i:])
            return
        if lt > i:
            sink.data(source[i:lt])
        if source.startswith("<!--", lt):
            close = source.find("-->", lt + 4)
            if close < 0:
                return  # an unclosed comment hides the rest, as in a browser
            i = close + 3
            continue
        if gt < lt:
            gt = source.find(">", lt)
        if gt < 0:
            sink.data(source[lt:])  # no tag can end any more: the rest is text
            return
        nxt = source[lt + 1 : lt + 2]
        if nxt in ("!", "?"):
            i = gt + 1  # doctype, CDATA, conditional comment, processing instruction
            continue
        match = _TAG_NAME.match(source, lt + 1, gt)
        if match is None:
            sink.data("<")
            i = lt + 1
            continue
        name = match.group(2).lower()
        if match.group(1):
            sink.end(name)
            i = gt + 1
            continue
        attrs = _attributes(source[match.end() : gt]) if name in ("a", "img") else {}
        sink.start(name, attrs)
        i = gt + 1
        if name in _VOID:
            sink.end(name)
        elif name in _RAWTEXT:
            end_tag = _RAWTEXT_END[name].search(source, i)
            if end_tag is None:
                sink.rawtext(name, source[i:])
                sink.end(name)
                return
            sink.rawtext(name, source[i : end_tag.start()])
            sink.end(name)
            after = source.find(">", end_tag.end())
            if after < 0:
                return
            i = after + 1


def html_to_text(html: str, *, max_chars: int = MAX_OUTPUT_CHARS, max_input_chars: int = MAX_INPUT_CHARS) -> str:
    """Readable text of an HTML document or fragment; never raises."""
    if not html:
        return ""
    sink = _TextExtractor(max_chars)
    try:
        _tokenize(html[:max_input_chars], sink)
    except Exception:  # keep whatever was extracted before the surprise
        pass
    try:
        return sink.result()
    except Exception:
        return ""
