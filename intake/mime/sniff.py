"""What an attachment's bytes are: libmagic, refined for Office and OpenDocument containers."""
from __future__ import annotations

import io
import re
import zipfile

SNIFF_BYTES = 8192
MACRO_OFFICE_TYPE = "application/vnd.ms-office.macroenabled"

OOXML_TYPES = {
    "word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "ppt/presentation.xml": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
_OLE_TYPES = frozenset({
    "application/msword", "application/vnd.ms-excel", "application/vnd.ms-powerpoint",
    "application/x-ole-storage", "application/cdfv2", "application/vnd.ms-office",
})
_VBA_OLE_MARKER = "_VBA_PROJECT".encode("utf-16-le")


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


def sniff_type(data: bytes) -> str:
    """The content type of `data` from its bytes: libmagic on the first `SNIFF_BYTES`, refined for Office."""
    sniffed = _libmagic(data)
    if data[:4] == b"PK\x03\x04":
        return _zip_type(data, sniffed)
    if sniffed in _OLE_TYPES and data.find(_VBA_OLE_MARKER) >= 0:
        return MACRO_OFFICE_TYPE
    return sniffed
