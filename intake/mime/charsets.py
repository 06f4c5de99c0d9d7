"""Bytes to text the way mail clients do it: charset aliases, fallbacks, RFC 2047 words.

    codec_for(label) -> codec name, or None when unknown or refused
    decode(data, charset=None, hint=None) -> str
    decode_encoded_words(value, hint=None) -> str

Mail declares charsets loosely and often wrongly, so a label is read as the
WHATWG Encoding Standard and the mail clients read it, as the superset the
sender's software really used: GB2312/GBK/EUC-CN -> gb18030 (GBK text sent
as "gb2312" holds characters such as 镕 outside GB2312), Shift_JIS -> cp932,
EUC-KR/ks_c_5601-1987 -> cp949, Big5 -> big5hkscs, TIS-620 -> cp874,
ISO-8859-8-i -> iso8859_8, and ISO-8859-1/windows-1252 -> windows-1252 as
WHATWG defines it (bytes 0x80-0x9F are the cp1252 characters; the five that
cp1252 leaves undefined become the C1 controls, never U+FFFD). ISO-2022-JP is
tried as iso2022_jp, iso2022_jp_ext (half-width katakana), iso2022_jp_2, and
as Windows writes it (CP50220: NEC and IBM extensions such as ①, read through
cp932). "us-ascii" on 8-bit data says nothing about the data: it is read as
undeclared.

`decode` decides per text:
- ASCII bytes are ASCII under any ASCII-compatible label (the common case, no work);
- the declared codec is used when it decodes cleanly, or when its errors are
  isolated (no more U+FFFD than correctly decoded non-ASCII characters): one
  bad byte in UTF-8 text costs one U+FFFD, never the whole text;
- a declared codec that fails on most of its non-ASCII bytes (Shift_JIS
  labelled ISO-2022-JP, cp1252 labelled UTF-8) is wrong: UTF-8, the hint (the
  charset the message's body declares), the other encodings of the label's
  script, then a detector (charset_normalizer, imported on first use) are
  tried, and the first that decodes cleanly, else the one with fewest errors,
  wins; when every candidate still fails on most bytes, windows-1252, which
  never fails, is the last resort;
- undeclared 8-bit bytes (raw header bytes, a body without charset) go the
  same way starting from UTF-8.

The detector is only asked with at least `DETECT_MIN_HIGH_BYTES` non-ASCII
bytes and only among the encodings mail really uses: measured on short
subjects it takes GBK for cp949, KOI8-R for cp932 and French cp1252 for
cp1250, which would be worse than the windows-1252 fallback.
"""

from __future__ import annotations

import binascii
import codecs
import re
from functools import lru_cache
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

WINDOWS_1252 = "windows-1252"  # WHATWG windows-1252 (cp1252 + C1 controls for its 5 holes)
ISO_2022_JP = "iso-2022-jp"  # the iso2022_jp variants, then CP50220 through cp932
DETECT_MIN_HIGH_BYTES = 32
DETECT_MAX_BYTES = 64 * 1024
MAX_LABEL_CHARS = 40

# Codecs that are text encodings in Python's eyes but never a mail charset, and
# slow or surprising on hostile input (punycode decoding is quadratic).
REFUSED_CODECS = frozenset({"punycode", "idna", "unicode-escape", "raw-unicode-escape", "undefined"})

# Labels Python does not know, or knows as a narrower codec than the one senders use.
_LABELS = {
    "x-gbk": "gb18030",
    "gb_2312-80": "gb18030",
    "csgb2312": "gb18030",
    "x-euc-cn": "gb18030",
    "windows-936": "gb18030",
    "ms936": "gb18030",
    "chinese": "gb18030",
    "iso-ir-58": "gb18030",
    "x-sjis": "cp932",
    "windows-31j": "cp932",
    "csshiftjis": "cp932",
    "x-ms-cp932": "cp932",
    "x-windows-949": "cp949",
    "windows-949": "cp949",
    "cseuckr": "cp949",
    "ks_c_5601-1989": "cp949",
    "x-x-big5": "big5hkscs",
    "cn-big5": "big5hkscs",
    "csbig5": "big5hkscs",
    "windows-874": "cp874",
    "x-windows-874": "cp874",
    "iso-8859-11": "cp874",
    "iso8859-11": "cp874",
    "iso-8859-8-i": "iso8859-8",
    "iso_8859-8-i": "iso8859-8",
    "csiso88598i": "iso8859-8",
    "logical": "iso8859-8",
    "x-euc-jp": "euc_jp",
    "cseucpkdfmtjapanese": "euc_jp",
    "unicode-1-1-utf-8": "utf-8",
    "x-unicode20utf8": "utf-8",
    "unicode-2-0-utf-8": "utf-8",
    "x-cp1252": WINDOWS_1252,
    "x-cp1250": "cp1250",
    "x-cp1251": "cp1251",
    "csiso2022jp": ISO_2022_JP,
    "iso-2022-jp-1": ISO_2022_JP,
    "iso-2022-jp-2": ISO_2022_JP,
    "x-mac-roman": "mac-roman",
    "x-mac-cyrillic": "mac-cyrillic",
}
# Python codec names (after codecs.lookup) read as the superset senders really use.
_SUPERSETS = {
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
    "tis-620": "cp874",
    "iso8859-1": WINDOWS_1252,
    "cp1252": WINDOWS_1252,
    "iso2022_jp": ISO_2022_JP,
    "iso2022_jp_1": ISO_2022_JP,
    "iso2022_jp_2": ISO_2022_JP,
    "iso2022_jp_ext": ISO_2022_JP,
}
# When a declared codec fails, the other encodings of its script come before the detector.
_SAME_SCRIPT = {
    ISO_2022_JP: ("cp932", "euc_jp"),
    "cp932": ("euc_jp", ISO_2022_JP),
    "euc_jp": ("cp932", ISO_2022_JP),
    "gb18030": ("big5hkscs",),
    "big5hkscs": ("gb18030",),
}
# What the detector may answer: the encodings mail uses, and no Latin sibling of cp1252 it cannot tell apart.
_DETECTABLE = [
    "utf_8",
    "gb18030",
    "big5hkscs",
    "cp932",
    "euc_jp",
    "cp949",
    "cp1251",
    "koi8_r",
    "cp1253",
    "cp1255",
    "cp1256",
    "cp874",
    "cp1252",
]
# Asked about short text that is neither UTF-8 nor the hint: a subject or file name in a CJK encoding.
_CJK_DETECTABLE = ["gb18030", "big5", "shift_jis", "euc_jp", "euc_kr"]
DETECT_SHORT_MIN_HIGH_BYTES = 2
_CJK_ORDER = {
    codec_name: index for index, codec_name in enumerate(["gb18030", "big5hkscs", "cp932", "euc_jp", "cp949"])
}
_LANGUAGE = {"gb18030": "Chinese", "big5hkscs": "Chinese", "cp932": "Japanese", "euc_jp": "Japanese", "cp949": "Korean"}
_SEVEN_BIT = frozenset({"ascii", "utf-7", "utf_7", "hz"})
_ISO_2022_JP_VARIANTS = ("iso2022_jp", "iso2022_jp_ext", "iso2022_jp_2", "iso2022_jp_2004")
_HIGH_BYTES = bytes(range(0x80, 0x100))
_ESC = b"\x1b"


def _c1_controls(error: UnicodeDecodeError) -> tuple[str, int]:
    """windows-1252 as WHATWG defines it: the bytes cp1252 leaves undefined are the C1 controls."""
    return chr(error.object[error.start]), error.start + 1


# A decoding handler (only bytes.decode names it), which register_error's type, for any UnicodeError, cannot say.
codecs.register_error("intake-c1-controls", cast("Callable[[UnicodeError], tuple[str, int]]", _c1_controls))


@lru_cache(maxsize=256)
def codec_for(label: str | None) -> str | None:
    """The codec to read `label` with (a Python codec name, `WINDOWS_1252` or `ISO_2022_JP`), else None."""
    if not label or not isinstance(label, str):
        return None
    name = label.strip().strip("\"'").strip().lower()
    if not name or len(name) > MAX_LABEL_CHARS:
        return None
    if name in _LABELS:
        return _LABELS[name]
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError, TypeError):
        return None
    if info.name in REFUSED_CODECS or not getattr(info, "_is_text_encoding", True):
        return None
    return _SUPERSETS.get(info.name, info.name)


@lru_cache(maxsize=64)
def _ascii_compatible(codec: str) -> bool:
    """Printable ASCII, tab and line ends decode to themselves (not UTF-16, UTF-7, HZ, EBCDIC...)."""
    probe = bytes(range(0x20, 0x7F)) + b"\t\r\n"
    try:
        return _decode_with(probe, codec, "strict") == probe.decode("ascii")
    except Exception:
        return False


def _decode_with(data: bytes, codec: str, errors: str) -> str:
    if codec == WINDOWS_1252:
        return data.decode("cp1252", "intake-c1-controls")
    if codec == ISO_2022_JP:
        return _decode_iso_2022_jp(data, errors)
    return data.decode(codec, errors)


def _counted(data: bytes, codec: str) -> tuple[str, int, int]:
    """(text with U+FFFD for bad sequences, how many, non-ASCII characters decoded correctly)."""
    try:
        text = _decode_with(data, codec, "replace")
    except Exception:  # a codec that cannot even replace (broken stateful decoders): a total failure
        return "", len(data) or 1, 0
    errors = text.count("\ufffd")
    if errors and codec == "utf-8":
        errors = max(0, errors - data.count(b"\xef\xbf\xbd"))  # U+FFFD that was in the text already
    non_ascii = len(text) - len(text.encode("ascii", "ignore"))
    return text, errors, non_ascii - errors


def _fails_mostly(errors: int, decoded: int) -> bool:
    return errors > decoded


def decode(data: bytes, charset: str | None = None, hint: str | None = None) -> str:
    """`data` as text, read as `charset` says (see the module docstring for the fallbacks).

    `hint`: the charset the message's body declares, tried for undeclared or failing text.
    """
    codec = codec_for(charset)
    if data.isascii():
        if codec is None or (_ascii_compatible(codec) and _ESC not in data):
            return data.decode("ascii")
    if codec is None or codec == "ascii":
        codec = "utf-8"
    if codec == "utf-8" or codec == WINDOWS_1252:
        try:
            return _decode_with(data, codec, "strict")
        except UnicodeDecodeError:
            pass
    text, errors, decoded = _counted(data, codec)
    if not errors or not _fails_mostly(errors, decoded):
        return text
    return _fallback(data, codec, text, errors, decoded, hint)


def _fallback(data: bytes, tried: str, text: str, errors: int, decoded: int, hint: str | None) -> str:
    """`tried` failed on most bytes: the first candidate that decodes cleanly, else the fewest errors."""
    best = (errors, text, decoded)
    seen = {tried}
    for candidate in _candidates(data, tried, hint):
        if candidate is None or candidate in seen:
            continue
        seen.add(candidate)
        text, errors, decoded = _counted(data, candidate)
        if not errors:
            return text
        if errors < best[0]:
            best = (errors, text, decoded)
    errors, text, decoded = best
    if _fails_mostly(errors, decoded):
        return _decode_with(data, WINDOWS_1252, "strict")
    return text


def _candidates(data: bytes, tried: str, hint: str | None) -> Iterator[str | None]:
    """Lazily, so that the detector runs only when the cheaper candidates failed. A single-byte hint
    (windows-1252, koi8-r) decodes any bytes "cleanly", so it comes after the detector has had its say
    on whether the bytes are CJK (a raw GB2312 subject in mail whose first text part is a Latin-1 report)."""
    yield "utf-8"
    hint_codec = codec_for(hint)
    single_byte = hint_codec is not None and _single_byte(hint_codec)
    if not single_byte:
        yield hint_codec
    yield from _SAME_SCRIPT.get(tried, ())
    detected = _detected(data)
    yield detected
    if detected is None:
        yield _detected_short(data, hint_codec if single_byte else None)
    yield hint_codec


def reads_8bit(charset: str | None) -> bool:
    """Whether text in `charset` can hold 8-bit bytes (not us-ascii, utf-7, iso-2022-*, hz)."""
    codec = codec_for(charset)
    if codec is None or codec == ISO_2022_JP:
        return False
    return codec not in _SEVEN_BIT and not codec.startswith("iso2022")


@lru_cache(maxsize=64)
def _single_byte(codec: str) -> bool:
    """Every byte is one character (windows-1252, koi8-r, iso-8859-7), so every byte string decodes."""
    try:
        return len(_decode_with(_HIGH_BYTES, codec, "replace")) == len(_HIGH_BYTES)
    except Exception:
        return False


def _detected_short(data: bytes, single_byte: str | None) -> str | None:
    """The detector on a few bytes (a subject, a file name) among the CJK encodings and one single-byte
    one (the hint, else windows-1252); the single-byte one wins a tie, as its bytes are likelier."""
    if not DETECT_SHORT_MIN_HIGH_BYTES <= len(data) - len(data.translate(None, _HIGH_BYTES)):
        return None
    try:
        from charset_normalizer import from_bytes
    except ImportError:
        return None
    fallback = single_byte or "cp1252"
    try:
        results = list(from_bytes(data[:DETECT_MAX_BYTES], cp_isolation=[*_CJK_DETECTABLE, fallback]))
    except Exception:
        return None
    if not results:
        return None
    best = min(result.chaos for result in results)
    # Never None: codec_for knows every encoding `cp_isolation` lets the detector answer.
    tied = cast("list[str]", [codec_for(result.encoding) for result in results if result.chaos <= best])
    if codec_for(fallback) in tied:
        return codec_for(fallback)
    # On a few characters the detector often cannot tell (chaos 0 for three encodings): the reading
    # that looks like its language wins, then the order of _CJK_DETECTABLE (raw GBK is the most common).
    return max(tied, key=lambda codec: (_plausibility(data, codec), -_CJK_ORDER.get(codec, 99)))


def _plausibility(data: bytes, codec: str) -> float:
    """How much `data` read as `codec` looks like text of that codec's language: its script alone
    (no Hanja between Hangul, kana in Japanese, no half-width katakana), plus its most frequent characters."""
    try:
        text = [char for char in _decode_with(data, codec, "strict") if ord(char) > 0x7F]
    except Exception:
        return -2.0
    if not text:
        return 0.0

    def count(low: int, high: int) -> int:
        return sum(1 for char in text if low <= ord(char) <= high)

    if count(0xFF61, 0xFF9F):
        return -1.0
    ideographs, hangul, kana = count(0x4E00, 0x9FFF), count(0xAC00, 0xD7A3), count(0x3040, 0x30FF)
    language = _LANGUAGE.get(codec, "")
    if language == "Korean":
        score = 1.0 if hangul == len(text) else 0.0
    elif language == "Japanese":
        score = 1.0 if kana else 0.0
    else:
        score = 1.0 if not hangul and not kana and ideographs else 0.0
    return score + sum(1 for char in text if char in _frequent(language)) / len(text)


@lru_cache(maxsize=8)
def _frequent(language: str) -> frozenset[str]:
    try:
        from charset_normalizer.constant import FREQUENCIES
    except ImportError:
        return frozenset()
    return frozenset(FREQUENCIES.get(language, ()))


def _detected(data: bytes) -> str | None:
    if len(data) - len(data.translate(None, _HIGH_BYTES)) < DETECT_MIN_HIGH_BYTES:
        return None
    try:
        from charset_normalizer import from_bytes
    except ImportError:
        return None
    try:
        best = from_bytes(data[:DETECT_MAX_BYTES], cp_isolation=_DETECTABLE).best()
    except Exception:
        return None
    return codec_for(best.encoding) if best is not None else None


# -- ISO-2022-JP ------------------------------------------------------------------------------

_JIS_SEGMENT = re.compile(rb"\x1b(\$@|\$B|\$\(D|\$\(Q|\$\(O|\(B|\(J|\(I|\$A|\$\(C|\.A|\.F|N)")
_JIS_TWO_BYTE = frozenset({b"$@", b"$B"})


def _decode_iso_2022_jp(data: bytes, errors: str) -> str:
    """The first variant that decodes cleanly; else CP50220 (through cp932), or iso2022_jp_2 if it does better."""
    for variant in _ISO_2022_JP_VARIANTS:
        try:
            return data.decode(variant, "strict")
        except UnicodeDecodeError:
            pass
    if errors == "strict":
        return _cp50220(data, "strict")
    return min(
        (_cp50220(data, "replace"), data.decode("iso2022_jp_2", "replace")), key=lambda text: text.count("\ufffd")
    )


def _cp50220(data: bytes, errors: str) -> str:
    """ISO-2022-JP as Windows writes it: JIS X 0208 rows transcoded to Shift_JIS, read as cp932.

    The NEC (row 13: ①, №, ㈱) and IBM extensions that Outlook puts in ISO-2022-JP
    are in cp932 but in no Python iso2022_jp codec.
    """
    pieces = []
    mode = b"(B"
    position = 0
    for match in _JIS_SEGMENT.finditer(data):
        pieces.append(_jis_segment(data[position : match.start()], mode, errors))
        mode = match.group(1)
        position = match.end()
    pieces.append(_jis_segment(data[position:], mode, errors))
    return "".join(pieces)


def _jis_segment(segment: bytes, mode: bytes, errors: str) -> str:
    if not segment:
        return ""
    if mode in (b"(B", b"(J"):
        return segment.decode("ascii", errors)  # 8-bit bytes are no ISO-2022-JP: errors
    if mode == b"(I":  # JIS X 0201 katakana: cp932's half-width forms
        return bytes(b + 0x80 if 0x21 <= b <= 0x5F else b for b in segment).decode("cp932", errors)
    if mode not in _JIS_TWO_BYTE:  # a character set cp932 has no equivalent for
        return _jis_error(segment, errors, max(1, len(segment) // 2))
    pieces, shift_jis = [], bytearray()
    for index in range(0, len(segment) - 1, 2):
        first, second = segment[index], segment[index + 1]
        if not (0x21 <= first <= 0x7E and 0x21 <= second <= 0x7E):
            pieces.append(shift_jis.decode("cp932", errors))
            pieces.append(_jis_error(segment, errors, 1))
            shift_jis = bytearray()
            continue
        lead = ((first + 1) >> 1) + (0x70 if first <= 0x5E else 0xB0)
        if first & 1:
            trail = second + (0x1F if second <= 0x5F else 0x20)
        else:
            trail = second + 0x7E
        shift_jis += bytes((lead, trail))
    pieces.append(shift_jis.decode("cp932", errors))
    if len(segment) % 2:
        pieces.append(_jis_error(segment, errors, 1))
    return "".join(pieces)


def _jis_error(segment: bytes, errors: str, count: int) -> str:
    if errors == "strict":
        raise UnicodeDecodeError("iso-2022-jp", segment, 0, len(segment), "not in CP50220")
    return "\ufffd" * count


# -- RFC 2047 encoded words -------------------------------------------------------------------

# The payload may hold spaces (broken mailers: "=?us-ascii?Q?ABC / 123?="); it cannot hold "?",
# so a match never spans two words and the scan stays linear.
ENCODED_WORD = re.compile(r"=\?([^?\s*]+)(?:\*[^?\s]*)?\?([qQbB])\?([^?]*)\?=")
_Q_ESCAPE = re.compile(rb"=([0-9A-Fa-f]{2})")


def _word_bytes(encoding: str, payload: str) -> bytes | None:
    try:
        if encoding in "bB":
            compact = "".join(payload.split())
            return binascii.a2b_base64(compact + "=" * (-len(compact) % 4))
        try:
            raw = payload.encode("latin-1")
        except UnicodeEncodeError:  # raw 8-bit text inside the word, already decoded
            raw = payload.encode("utf-8")
        return _Q_ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw.replace(b"_", b" "))
    except (binascii.Error, ValueError):
        return None


def decode_encoded_words(value: str, hint: str | None = None) -> str:
    """RFC 2047 words decoded; whitespace between adjacent words dropped.

    Adjacent words of one charset and encoding are joined as bytes before decoding,
    so a multibyte character split across two words (as many encoders do) survives.
    A word that does not decode stays as written.
    """
    if "=?" not in value:
        return value
    out: list[str] = []
    run_key = None  # (charset, encoding) of the words in `run`
    run = bytearray()
    position = 0
    for match in ENCODED_WORD.finditer(value):
        between = value[position : match.start()]
        charset, encoding, payload = match.group(1), match.group(2), match.group(3)
        data = _word_bytes(encoding, payload)
        adjacent = run_key is not None and (not between or between.isspace())
        if data is None:
            if run_key is not None:
                out.append(decode(bytes(run), run_key[0], hint))
                run_key, run = None, bytearray()
            out.append(between + match.group(0))
        else:
            key = (charset.lower(), encoding.lower())
            if adjacent and key == run_key:
                run += data
            else:
                if run_key is not None:
                    out.append(decode(bytes(run), run_key[0], hint))
                if not adjacent:
                    out.append(between)
                run_key, run = key, bytearray(data)
        position = match.end()
    if run_key is not None:
        out.append(decode(bytes(run), run_key[0], hint))
    out.append(value[position:])
    return "".join(out)
