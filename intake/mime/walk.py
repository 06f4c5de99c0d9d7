"""The part walk: which parts are body text, attachments, signatures or ciphertext.

`_walk` visits the MIME tree under the limits (`MAX_DEPTH`, `MAX_PARTS`) and fills a `_Walk`;
`intake.mime.parse.parse_message` turns that into a `ParsedMessage`.
"""
from __future__ import annotations

import hashlib
from email.parser import BytesParser
from typing import Any

from . import cms, tnef
from .body import _add_text, _alternative_rank, _drop_text, _html_instead_of_stub
from .headers import _clean_filename
from .message import Attachment, _add_defect
from .parts import _add_attachment, _content_type, _part_bytes, _part_name, _TnefMember
from .policy import _PARSE_POLICY
from .sniff import sniff_type

MAX_DEPTH = 32
MAX_PARTS = 2000
MAX_BOUNDARY_LINES = 20_000  # lines starting with "--" beyond which only the headers are parsed
MAX_SIGNATURES = 20
MAX_ALTERNATIVES = 20
# Report parts: data about a message, not content (DSNs, MDNs, abuse reports).
_REPORT_TYPES = frozenset({
    "message/delivery-status", "message/disposition-notification", "message/feedback-report",
    "text/rfc822-headers", "message/global-delivery-status", "message/global-disposition-notification",
    "message/global-headers",
})
# Codecs that are text encodings in Python's eyes but never a mail charset, and
_SIGNATURE_TYPES = {"application/pgp-signature": "pgp", "application/pkcs7-signature": "smime",
                    "application/x-pkcs7-signature": "smime"}
_PKCS7_MIME_TYPES = frozenset({"application/pkcs7-mime", "application/x-pkcs7-mime"})
_ENCRYPTED_SMIME_KINDS = frozenset({"enveloped-data", "authenveloped-data"})
_TNEF_TYPES = frozenset({"application/vnd.ms-tnef", "application/ms-tnef"})
# Other renderings of the body in multipart/alternative (Gmail AMP, Apple Watch): neither body nor file.
_RENDERING_TYPES = frozenset({"text/x-amp-html", "text/watch-html", "text/enriched", "text/richtext"})


class _Walk:
    def __init__(self, defects: list):
        self.defects = defects
        self.text: list[str] = []
        self.text_sources: list[str] = []    # "plain", "html" or "rtf", one for each entry of `text`
        self.text_chars = 0
        self.truncated = False               # some body text was cut or left out
        self.attachments: list[tuple[tuple, Attachment, Any]] = []
        self.parts = 0
        self.too_complex = False
        # Inline text parts with a filename: attachments, and the body if there is no other.
        self.fallback_text: list[tuple[Any, str]] = []
        # Bodies found in winmail.dat parts, (text, source): the body if there is no other.
        self.tnef_bodies: list[tuple[str, str]] = []
        self.signatures: list[dict] = []
        self.encrypted = ""
        self.alternatives: list[dict] = []
        # id(part) -> (text, cut) of HTML parts converted so far: the alternative choice may convert one early.
        self.html_text: dict[int, tuple[str, bool]] = {}


def _walk_alternative(walk: _Walk, children: list, depth: int, path: tuple) -> None:
    """multipart/alternative as the body: the first part with text in the order plain, multipart, HTML,
    except that a plain stub gives way to the HTML (`intake.mime.alternatives`). Every alternative is recorded."""
    types = [_content_type(child) for child in children]
    # (index, rank) in the order tried, stable; other renderings (AMP, ...) are never read nor listed.
    ranked = sorted(((index, _alternative_rank(ctype)) for index, ctype in enumerate(types)
                     if ctype not in _RENDERING_TYPES or children[index].is_multipart()), key=lambda item: item[1])
    chars: dict[int, int] = {}   # readable characters of the alternatives that were read
    walked = {index for index, ctype in enumerate(types) if ctype in _RENDERING_TYPES}
    chosen, start = None, len(walk.text)
    for index, _rank in ranked:
        start = len(walk.text)
        walked.add(index)
        _walk(walk, children[index], depth + 1, "body", path + (index,))
        chars[index] = sum(len(text) for text in walk.text[start:])
        if len(walk.text) > start:
            chosen = index
            break
    if chosen is not None and types[chosen] == "text/plain":
        html_index = _html_instead_of_stub(walk, children, ranked, chosen, start, chars)
        if html_index is not None:
            stub = (walk.text[start:], walk.text_sources[start:], walk.truncated)
            _drop_text(walk, start)
            walked.add(html_index)
            _walk(walk, children[html_index], depth + 1, "body", path + (html_index,))
            if len(walk.text) > start:
                chosen = html_index
                chars[html_index] = sum(len(text) for text in walk.text[start:])
            else:   # nothing came of it after all: keep the plain text
                walk.text[start:], walk.text_sources[start:], walk.truncated = stub
                walk.text_chars += sum(len(text) for text in stub[0])
    for index, child in enumerate(children):
        if index not in walked:
            _walk(walk, child, depth + 1, "alternate", path + (index,))
    for index, ctype in enumerate(types[:MAX_ALTERNATIVES]):
        walk.alternatives.append({"type": ctype, "chars": chars.get(index), "chosen": index == chosen})


def _record_signature(walk: _Walk, part, protocol: str, ctype: str, data: bytes | None = None) -> None:
    if len(walk.signatures) >= MAX_SIGNATURES:
        return
    if data is None:
        try:
            data = _part_bytes(part)
        except Exception:
            data = b""
    walk.signatures.append({"protocol": protocol, "type": ctype, "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()})


def _walk_signed(walk: _Walk, children: list, depth: int, role: str, path: tuple) -> None:
    """multipart/signed: the content is walked as usual; the signature part is recorded, not listed
    (an attached message's signature is not recorded: it is about that message, listed as a whole)."""
    for index, child in enumerate(children):
        ctype = _content_type(child)
        protocol = _SIGNATURE_TYPES.get(ctype) if index and not child.is_multipart() else None
        if protocol is None:
            _walk(walk, child, depth + 1, role, path + (index,))
        elif _count_part(walk) and role != "nested":
            _record_signature(walk, child, protocol, ctype)


def _walk_encrypted(walk: _Walk, children: list, role: str, path: tuple) -> None:
    """multipart/encrypted (PGP/MIME): a control part ("Version: 1"), then the ciphertext, kept for a person."""
    walk.encrypted = walk.encrypted or "pgp"
    for index, child in enumerate(children):
        if not _count_part(walk):
            return
        ctype = _content_type(child)
        if ctype == "application/pgp-encrypted" and not child.is_multipart():
            continue
        _add_attachment(walk, child, path + (index,), ctype, child.get_content_disposition(),
                        _part_name(child, ctype, child.get_filename()), role == "nested", origin="encrypted")


def _smime_type(part) -> str:
    try:
        value = part.get_param("smime-type")
    except Exception:
        return ""
    if isinstance(value, tuple):
        value = value[2]
    return str(value or "").strip().lower()


def _is_smime_p7m(filename) -> bool:
    return bool(filename) and str(filename).strip().lower() == "smime.p7m"


def _unwrap_signed_data(walk: _Walk, data: bytes, depth: int):
    """The MIME entity inside opaque S/MIME signed data, parsed; None if it cannot be had."""
    if depth + 1 > MAX_DEPTH:
        _add_defect(walk.defects, "DepthLimitExceeded")
        walk.too_complex = True
        return None
    content = cms.signed_content(data)
    if content is None:
        _add_defect(walk.defects, "UnreadableSignedData")
        return None
    if content.count(b"\n--") > MAX_BOUNDARY_LINES:
        _add_defect(walk.defects, "TooManyBoundaryLines")
        walk.too_complex = True
        return None
    try:
        return BytesParser(policy=_PARSE_POLICY).parsebytes(content)
    except Exception as exc:
        _add_defect(walk.defects, f"Unparseable:{type(exc).__name__}")
        return None


def _walk_pkcs7(walk: _Walk, part, depth: int, role: str, path: tuple, ctype: str, disposition, filename) -> None:
    """S/MIME application/pkcs7-mime. Opaque signed data is unwrapped and its content walked in its place
    (the blob recorded as a signature); enveloped data, or signed data that cannot be unwrapped, is
    encrypted mail: the blob is listed with origin "encrypted" for a person. Other kinds (certs-only)
    are ordinary files."""
    try:
        data = _part_bytes(part)
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    kind = _smime_type(part) or cms.content_kind(data)
    name = _part_name(part, ctype, filename)
    if kind == "signed-data":
        if role != "nested":
            _record_signature(walk, part, "smime", ctype, data)
        inner = _unwrap_signed_data(walk, data, depth)
        if inner is not None:
            _walk(walk, inner, depth + 1, role, path + (0,))
            return
    elif kind not in _ENCRYPTED_SMIME_KINDS and not (not kind and _is_smime_p7m(filename)):
        _add_attachment(walk, part, path, ctype, disposition, name, role == "nested", data=data)
        return
    walk.encrypted = walk.encrypted or "smime"
    _add_attachment(walk, part, path, ctype, disposition, name, role == "nested", origin="encrypted", data=data)


def _add_tnef(walk: _Walk, part, role: str, path: tuple, ctype: str, disposition, filename) -> None:
    """A winmail.dat is listed as the files inside it (origin "tnef"), and its body kept in case there is
    no other. One that cannot be unpacked is listed as itself: the default policy refuses its type, so a
    person looks at it."""
    try:
        data = _part_bytes(part)
    except Exception as exc:
        _add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    unpacked = tnef.unpack(data) if data else None
    if unpacked is None:
        _add_defect(walk.defects, "UnreadableTnef")
        _add_attachment(walk, part, path, ctype, disposition, _part_name(part, ctype, filename), role == "nested",
                        data=data)
        return
    for index, member in enumerate(unpacked.members):
        attachment = Attachment(
            filename=_clean_filename(member.name),
            declared_type=member.mime_type or "application/octet-stream",
            sniffed_type=sniff_type(member.data),
            size=len(member.data),
            sha256=hashlib.sha256(member.data).hexdigest(),
            content_id="",
            is_inline=False,
            nested=role == "nested",
            origin="tnef",
        )
        walk.attachments.append((path + (index,), attachment, _TnefMember(part, index)))
    if role == "body" and unpacked.body:
        walk.tnef_bodies.append((unpacked.body, unpacked.body_source))


def _count_part(walk: _Walk) -> bool:
    """Count one more part; False once `MAX_PARTS` is passed (the walk stops there)."""
    walk.parts += 1
    if walk.parts <= MAX_PARTS:
        return True
    if not walk.too_complex:
        _add_defect(walk.defects, "PartLimitExceeded")
    walk.too_complex = True
    return False


def _walk(walk: _Walk, part, depth: int, role: str, path: tuple) -> None:
    """Visit one part. `role`: "body" (text counts), "alternate" (a rejected alternative) or "nested"."""
    if not _count_part(walk):
        return
    if depth:
        for defect in getattr(part, "defects", ())[:10]:
            _add_defect(walk.defects, type(defect).__name__)
    ctype = _content_type(part)
    maintype = ctype.split("/", 1)[0]
    if part.is_multipart():
        children = part.get_payload()
        if maintype == "message":
            if ctype in ("message/rfc822", "message/global"):
                _add_attachment(walk, part, path, ctype, part.get_content_disposition(),
                                _part_name(part, ctype, part.get_filename()), role == "nested")
                role = "nested"
            else:
                return  # delivery-status and other report data
        if depth + 1 > MAX_DEPTH:
            if not walk.too_complex:
                _add_defect(walk.defects, "DepthLimitExceeded")
            walk.too_complex = True
            return
        if ctype == "multipart/signed":
            _walk_signed(walk, children, depth, role, path)
        elif ctype == "multipart/encrypted":
            _walk_encrypted(walk, children, role, path)
        elif ctype == "multipart/alternative" and role == "body":
            _walk_alternative(walk, children, depth, path)
        else:
            for index, child in enumerate(children):
                _walk(walk, child, depth + 1, role, path + (index,))
        return

    disposition = part.get_content_disposition()
    filename = part.get_filename()
    if ctype in _REPORT_TYPES:
        return
    if maintype == "multipart":
        # A multipart whose boundary never shows: its raw body is the best text there is.
        if role == "body":
            _add_text(walk, part, "text/plain")
        return
    if ctype in _PKCS7_MIME_TYPES or (ctype == "application/octet-stream" and _is_smime_p7m(filename)):
        _walk_pkcs7(walk, part, depth, role, path, ctype, disposition, filename)
        return
    if ctype in _TNEF_TYPES or (filename and str(filename).strip().lower() == "winmail.dat"):
        _add_tnef(walk, part, role, path, ctype, disposition, filename)
        return
    if ctype in ("text/plain", "text/html") and disposition != "attachment":
        if not filename:
            if role == "body":
                _add_text(walk, part, ctype)
            return
        if role == "body" and disposition == "inline" and len(walk.fallback_text) < 10:
            walk.fallback_text.append((part, ctype))
    _add_attachment(walk, part, path, ctype, disposition, _part_name(part, ctype, filename), role == "nested")
