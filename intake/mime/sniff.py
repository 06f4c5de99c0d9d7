"""What an attachment's bytes are: libmagic, refined where it is known to guess wrong.

Refinements: a ZIP is given its OOXML or OpenDocument type only when it holds
that format's main part, `MACRO_OFFICE_TYPE` when it (or an OLE file) holds a
VBA project; an attached message (declared message/rfc822, or named `.eml`)
whose bytes begin with a header block (`looks_like_message`) is
message/rfc822, whatever libmagic says of its body (text/html, text/plain,
application/octet-stream); an S/MIME signature (declared pkcs7-signature, or
named `.p7s`) that is CMS signed data is application/pkcs7-signature
(libmagic: application/octet-stream), and a certificates-only one (declared
pkcs7-mime, or named `.p7c`) is application/pkcs7-mime; an XHTML page (libmagic: text/xml) is
text/html; an OLE file whose root holds Outlook's MAPI streams is
application/vnd.ms-outlook (libmagic says so only when the directory falls in
the bytes it reads), and so is one declared or named as a .msg that olefile
cannot read (it goes to a person, `intake.mime.outlookmsg`). Only bytes
decide: a declaration that the bytes do not bear out changes nothing.
"""

from __future__ import annotations

import io
import re
import zipfile

from . import cms

SNIFF_BYTES = 8192
MACRO_OFFICE_TYPE = "application/vnd.ms-office.macroenabled"

OOXML_TYPES = {
    "word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt/presentation.xml": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
_OLE_TYPES = frozenset(
    {
        "application/msword",
        "application/vnd.ms-excel",
        "application/vnd.ms-powerpoint",
        "application/x-ole-storage",
        "application/cdfv2",
        "application/vnd.ms-office",
    }
)
_VBA_OLE_MARKER = "_VBA_PROJECT".encode("utf-16-le")
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
OUTLOOK_MSG_TYPE = "application/vnd.ms-outlook"


def _libmagic(data: bytes) -> str:
    try:
        import magic  # python-magic over libmagic1

        return (magic.from_buffer(bytes(data[:SNIFF_BYTES]), mime=True) or "application/octet-stream").lower()
    except Exception:
        return "application/octet-stream"


def _zip_type(data: bytes, sniffed: str) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            lowered = {name.lower() for name in names[:100_000]}
            if any(name.endswith("vbaproject.bin") for name in lowered):
                return MACRO_OFFICE_TYPE
            if "[content_types].xml" in lowered:
                for main_part, ooxml in OOXML_TYPES.items():
                    if main_part in lowered:
                        return ooxml
            if "mimetype" in lowered:
                member = next(name for name in names if name.lower() == "mimetype")
                with archive.open(member) as handle:
                    declared = handle.read(100).decode("ascii", "replace").strip()
                if re.fullmatch(r"application/vnd\.oasis\.opendocument\.[a-z.-]+", declared):
                    return declared
    except Exception:
        pass
    return sniffed


_MESSAGE_TYPES = frozenset({"message/rfc822", "message/global"})
_SMIME_SIGNATURE_TYPES = frozenset({"application/pkcs7-signature", "application/x-pkcs7-signature"})
_SMIME_MIME_TYPES = frozenset({"application/pkcs7-mime", "application/x-pkcs7-mime"})
CERTS_ONLY_TYPE = "application/pkcs7-mime"
_HEADER_LINE = re.compile(rb"[!-9;-~]{1,76}[ \t]*:")
# Fields that only a message's header block has together (a pasted "Subject:" line is not a message).
_MESSAGE_FIELDS = frozenset(
    {
        b"from",
        b"date",
        b"subject",
        b"message-id",
        b"to",
        b"received",
        b"mime-version",
        b"return-path",
        b"cc",
        b"reply-to",
        b"sender",
        b"dkim-signature",
        b"content-type",
    }
)
_IDENTIFYING_FIELDS = frozenset({b"from", b"date", b"message-id", b"received"})
_XHTML_ROOT = re.compile(rb"<html[\s>]", re.IGNORECASE)


def _ole_kind(data: bytes) -> str:
    """ "msg" for an Outlook message (its root holds the MAPI property streams), "other" for another OLE
    file, "unreadable" when olefile cannot read its directory (libmagic sees only the first 8 KiB)."""
    try:
        import olefile

        with olefile.OleFileIO(bytes(data)) as ole:
            names = {entry[0].lower() for entry in ole.listdir(streams=True, storages=True) if len(entry) == 1}
    except Exception:
        return "unreadable"
    return "msg" if {"__properties_version1.0", "__substg1.0_001a001f"} <= names else "other"


def looks_like_message(data: bytes) -> bool:
    """Do `data` begin with a mail header block: header lines up to a blank line (or the end of what is
    read), with at least three of the usual fields, one of them From, Date, Message-ID or Received?"""
    head = bytes(data[:SNIFF_BYTES]).lstrip(b"\r\n")
    if head.startswith(b"From "):  # an mbox separator line
        head = head.split(b"\n", 1)[-1]
    names = set()
    lines = head.split(b"\n")
    for number, line in enumerate(lines):
        line = line.rstrip(b"\r")
        if not line:
            break
        if line[:1] in (b" ", b"\t") and number:
            continue
        match = _HEADER_LINE.match(line)
        if match is None:
            if number + 1 < len(lines):  # a line that is not a header before the blank line: not a message
                return False
            break  # the last line read, cut by SNIFF_BYTES
        names.add(line.split(b":", 1)[0].strip().lower())
    fields = names & _MESSAGE_FIELDS
    return len(fields) >= 3 and bool(fields & _IDENTIFYING_FIELDS)


def _extension(filename: str) -> str:
    return filename.rsplit(".", 1)[-1].strip().lower() if "." in (filename or "") else ""


def sniff_type(data: bytes, *, declared_type: str = "", filename: str = "") -> str:
    """The content type of `data` from its bytes: libmagic on the first `SNIFF_BYTES`, refined as the
    module says. `declared_type` and `filename` only say which refinement to try."""
    sniffed = _libmagic(data)
    if data[:4] == b"PK\x03\x04":
        return _zip_type(data, sniffed)
    declared_type = (declared_type or "").lower()
    extension = _extension(filename)
    if data[:8] == OLE_MAGIC and (sniffed in _OLE_TYPES or sniffed == OUTLOOK_MSG_TYPE):
        kind = _ole_kind(data)
        if kind == "msg" or (kind == "unreadable" and (declared_type == OUTLOOK_MSG_TYPE or extension == "msg")):
            return OUTLOOK_MSG_TYPE  # one that cannot be opened is still a .msg: a person looks at it
    if sniffed in _OLE_TYPES and data.find(_VBA_OLE_MARKER) >= 0:
        return MACRO_OFFICE_TYPE
    if (
        (declared_type in _MESSAGE_TYPES or extension == "eml")
        and sniffed not in _MESSAGE_TYPES
        and looks_like_message(data)
    ):
        return "message/rfc822"
    if (
        (declared_type in _SMIME_SIGNATURE_TYPES or extension == "p7s")
        and data[:1] == b"\x30"
        and cms.content_kind(bytes(data[: 1 << 20])) == "signed-data"
    ):
        return "application/pkcs7-signature"
    if (
        (declared_type in _SMIME_MIME_TYPES or extension == "p7c")
        and data[:1] == b"\x30"
        and cms.is_certs_only(bytes(data[: 1 << 20]))
    ):
        return CERTS_ONLY_TYPE  # certificates only (smime.p7c): a file, neither signature nor ciphertext
    if sniffed in ("text/xml", "application/xml") and _XHTML_ROOT.search(data[:SNIFF_BYTES]):
        return "text/html"
    return sniffed


def whole_file_needed(head: bytes) -> bool:
    """Whether `sniff_type` may answer differently for a whole file than for its first bytes `head`
    (at least a MiB of them): a ZIP or an OLE file is looked inside."""
    return head[:4] == b"PK\x03\x04" or head[:8] == OLE_MAGIC or _libmagic(head) in _OLE_TYPES
