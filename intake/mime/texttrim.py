"""Cutting text to a size limit without cutting a sentence in half.

    trim_text(text, limit, notice) -> (text, was_trimmed)
    cut_at_boundary(text, limit) -> str

Where the cut falls: at the last paragraph boundary (a blank line) before the
limit, else the last line break, else the last sentence end, else the last
space, else at the limit itself. A boundary is only taken if it keeps at least
half of the limit, so that one early blank line followed by a wall of text
does not cost all of that text (the next finer boundary is tried instead).

The parser (`intake.mime`) uses it for the description; destinations with a
size limit use `trim_text` to fit a description and a notice such as
"[message truncated]" into that limit. Work is linear in `limit`.
"""

from __future__ import annotations

_PARAGRAPH_BREAKS = ("\n\n", "\n\r\n")
# A sentence end and what follows it; the cut keeps the first character.
_SENTENCE_ENDS = (". ", "! ", "? ", ".\t", "\u3002", "\uff01", "\uff1f", "\u2026 ")


def cut_at_boundary(text: str, limit: int) -> str:
    """A prefix of `text`, at most `limit` characters, that ends at a boundary (see the module docstring).

    `text` is taken to go on past what is kept: even when it is shorter than
    `limit`, the cut is made at its last boundary (for text whose input was cut).
    """
    if limit <= 0 or not text:
        return ""
    end = min(limit, len(text))
    floor = end // 2
    cut = -1
    for separator in _PARAGRAPH_BREAKS:
        cut = max(cut, text.rfind(separator, floor, end + len(separator)))
    if cut < floor:
        cut = text.rfind("\n", floor, end + 1)
    if cut < floor:
        for ending in _SENTENCE_ENDS:
            found = text.rfind(ending, floor, end + len(ending) - 1)
            if found >= 0:
                cut = max(cut, found + 1)
    if cut < floor:
        cut = text.rfind(" ", floor, end + 1)
    if cut < floor:
        cut = end
    return text[:cut].rstrip()


def trim_text(text: str, limit: int, notice: str) -> tuple[str, bool]:
    """`text` if it fits in `limit` characters, else its beginning cut at a boundary followed by `notice`,
    together at most `limit` characters. Returns (text, was_trimmed)."""
    if len(text) <= limit:
        return text, False
    room = limit - len(notice)
    if room <= 0:
        return notice[: max(limit, 0)], True
    return cut_at_boundary(text, room) + notice, True
