"""Just enough of CMS (PKCS #7, RFC 5652) to read S/MIME `application/pkcs7-mime` parts.

    content_kind(blob) -> "signed-data" | "enveloped-data" | "authenveloped-data" | ""
    is_certs_only(blob) -> bool
    signed_content(blob) -> bytes | None

`content_kind` says what a DER/BER blob is from its outer content type, for
parts that carry no `smime-type` parameter. `signed_content` takes the signed
content (the inner MIME entity) out of opaque signed data, which Outlook sends
as `smime.p7m`, so that the mail can be read like any other; the signature is
not verified (intake does not verify signatures anywhere).

Why not `cryptography`: its ASN.1 decoder reads DER only, while S/MIME clients
write BER (indefinite lengths, the content in chunked constructed OCTET
STRINGs). The reader below follows one path through the structure, rejects
tags it does not expect, nests at most `MAX_NESTING` levels and reads every
byte at most once, so hostile input costs time linear in its size.
"""

from __future__ import annotations

from typing import cast

MAX_NESTING = 32

_OID_DATA = bytes.fromhex("2a864886f70d010701")  # 1.2.840.113549.1.7.1
_KIND_BY_OID = {
    bytes.fromhex("2a864886f70d010702"): "signed-data",  # 1.2.840.113549.1.7.2
    bytes.fromhex("2a864886f70d010703"): "enveloped-data",  # 1.2.840.113549.1.7.3
    bytes.fromhex("2a864886f70d0109100117"): "authenveloped-data",  # 1.2.840.113549.1.9.16.1.23
}
_SEQUENCE, _SET, _OID, _INTEGER, _OCTETS, _CONSTRUCTED_OCTETS, _EXPLICIT_0 = 0x30, 0x31, 0x06, 0x02, 0x04, 0x24, 0xA0


class _Malformed(Exception):
    pass


def _header(data: bytes, pos: int) -> tuple[int, int, int | None]:
    """(tag, start of contents, length or None when indefinite) of the element at `pos`."""
    if pos + 2 > len(data):
        raise _Malformed
    tag, first = data[pos], data[pos + 1]
    if tag & 0x1F == 0x1F:  # high tag numbers: nothing CMS needs here
        raise _Malformed
    pos += 2
    if first < 0x80:
        length = first
    elif first == 0x80:
        if not tag & 0x20:  # indefinite length is only for constructed encodings
            raise _Malformed
        return tag, pos, None
    else:
        size = first & 0x7F
        if size > 4 or pos + size > len(data):
            raise _Malformed
        length = int.from_bytes(data[pos : pos + size], "big")
        pos += size
    if pos + length > len(data):
        raise _Malformed
    return tag, pos, length


def _end(data: bytes, pos: int, depth: int = 0) -> int:
    """Position just past the element at `pos` (walks into indefinite-length ones)."""
    if depth > MAX_NESTING:
        raise _Malformed
    tag, start, length = _header(data, pos)
    if length is not None:
        return start + length
    pos = start
    while data[pos : pos + 2] != b"\x00\x00":
        pos = _end(data, pos, depth + 1)
    return pos + 2


def _expect(data: bytes, pos: int, tag: int) -> tuple[int, int | None]:
    found, start, length = _header(data, pos)
    if found != tag:
        raise _Malformed
    return start, length


def _kind_at(data: bytes) -> tuple[str, int]:
    """The content type of a ContentInfo, and where its [0] content begins."""
    pos, _ = _expect(data, 0, _SEQUENCE)
    start, length = _expect(data, pos, _OID)
    length = cast(int, length)  # an OID is primitive, and `_header` gives no primitive an indefinite length
    return _KIND_BY_OID.get(bytes(data[start : start + length]), ""), start + length


def content_kind(blob: bytes) -> str:
    """What a CMS ContentInfo holds: "signed-data", "enveloped-data", "authenveloped-data" or "" (unknown)."""
    try:
        return _kind_at(blob)[0]
    except (_Malformed, IndexError):
        return ""


def _octets(data: bytes, pos: int, out: list[bytes], depth: int = 0) -> int:
    """Append the bytes of the OCTET STRING at `pos` (primitive or chunked) to `out`; its end."""
    if depth > MAX_NESTING:
        raise _Malformed
    tag, start, length = _header(data, pos)
    if tag == _OCTETS:
        length = cast(int, length)  # primitive: never of indefinite length (`_header`)
        out.append(data[start : start + length])
        return start + length
    if tag != _CONSTRUCTED_OCTETS:
        raise _Malformed
    pos = start
    while (pos < start + length) if length is not None else (data[pos : pos + 2] != b"\x00\x00"):
        pos = _octets(data, pos, out, depth + 1)
    return pos if length is not None else pos + 2


def _encap_content_info(blob: bytes) -> int | None:
    """Where the encapContentInfo of CMS signed data starts, or None if `blob` is not signed data.
    Raises _Malformed or IndexError on broken DER (the callers catch both)."""
    kind, pos = _kind_at(blob)
    if kind != "signed-data":
        return None
    pos, _ = _expect(blob, pos, _EXPLICIT_0)
    pos, _ = _expect(blob, pos, _SEQUENCE)  # SignedData
    pos = _end(blob, pos) if blob[pos] == _INTEGER else pos  # version
    if blob[pos] != _SET:
        return None
    return _end(blob, pos)  # past digestAlgorithms


def is_certs_only(blob: bytes) -> bool:
    """Signed data with no content and no signers: a certificates-only message (smime.p7c, RFC 8551 3.6)."""
    try:
        pos = _encap_content_info(blob)
        if pos is None:
            return False
        content_info_end = _end(blob, pos)
        pos, indefinite = _expect(blob, pos, _SEQUENCE)  # encapContentInfo
        start, length = _expect(blob, pos, _OID)
        length = cast(int, length)  # primitive: never indefinite
        if start + length < content_info_end - (2 if indefinite is None else 0):
            return False  # it holds content
        pos = content_info_end
        while blob[pos] in (0xA0, 0xA1):  # [0] certificates, [1] crls
            pos = _end(blob, pos)
        tag, start, length = _header(blob, pos)  # signerInfos: none
        return tag == _SET and (length == 0 or (length is None and blob[start : start + 2] == b"\x00\x00"))
    except (_Malformed, IndexError):
        return False


def signed_content(blob: bytes) -> bytes | None:
    """The encapsulated content of opaque CMS signed data (id-data only), or None if `blob` is not that."""
    try:
        pos = _encap_content_info(blob)
        if pos is None:
            return None
        pos, _ = _expect(blob, pos, _SEQUENCE)  # encapContentInfo
        start, length = _expect(blob, pos, _OID)
        length = cast(int, length)  # primitive: never indefinite
        if blob[start : start + length] != _OID_DATA:
            return None
        pos = start + length
        if blob[pos] != _EXPLICIT_0:  # detached: no content here
            return None
        pos, _ = _expect(blob, pos, _EXPLICIT_0)
        chunks: list[bytes] = []
        _octets(blob, pos, chunks)
        return b"".join(chunks)
    except (_Malformed, IndexError):
        return None
