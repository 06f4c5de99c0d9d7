"""Which language a requester wrote in: the `Content-Language` header when it names one, else the body text,
judged by `lingua` among the languages the tenant has templates for (and English, the built-in text).

A detector is built once per process for each set of languages (`lru_cache`), in lingua's low-accuracy mode:
its models for those languages only are loaded on first use (about 10 MB for three languages) and a message
takes well under a millisecond after that. Only the start of the text is read (`MAX_DETECT_CHARS`): a
customer's first paragraphs say which language they write in; quoted history and signatures come later.
"""

from __future__ import annotations

import re
from functools import lru_cache

from lingua import IsoCode639_1, LanguageDetectorBuilder

MAX_DETECT_CHARS = 1000
FALLBACK = "en"
LANGUAGE_TAG = re.compile(r"^\s*([A-Za-z]{2})(?:[-_][A-Za-z0-9]{1,8})*\s*$")


def _iso(code: str):
    try:
        return IsoCode639_1.from_str(code.lower())
    except ValueError:
        return None


def is_known(code: str) -> bool:
    """Is `code` an ISO 639-1 code lingua can detect?"""
    return bool(re.fullmatch(r"[a-z]{2}", code or "")) and _iso(code) is not None


def from_header(value: str) -> str:
    """`Content-Language: de-AT, en` -> "de" (the first tag's primary subtag); "" when it names none."""
    for tag in (value or "").split(","):
        match = LANGUAGE_TAG.match(tag)
        if match:
            return match.group(1).lower()
    return ""


@lru_cache(maxsize=32)
def detector(languages: frozenset[str]):
    """The detector for `languages` (ISO 639-1 codes; English is always one of them): built once per process."""
    codes = sorted({FALLBACK, *(code for code in languages if is_known(code))})
    return (
        LanguageDetectorBuilder.from_iso_codes_639_1(*(_iso(code) for code in codes)).with_low_accuracy_mode().build()
    )


def from_text(text: str, *, languages: frozenset[str]) -> str:
    """The language of `text` among `languages` (and English), or "" when the detector cannot tell."""
    text = (text or "")[:MAX_DETECT_CHARS]
    if not text.strip() or not languages - {FALLBACK}:
        return ""  # nothing to tell apart: only the English (or fallback) text exists
    language = detector(frozenset(languages)).detect_language_of(text)
    return language.iso_code_639_1.name.lower() if language is not None else ""


def language_of(*, header: str, text: str, languages: frozenset[str]) -> tuple[str, str]:
    """(language, how it was found: "header", "text" or "") of a message."""
    declared = from_header(header)
    if declared:
        return declared, "header"
    detected = from_text(text, languages=languages)
    return (detected, "text") if detected else ("", "")
