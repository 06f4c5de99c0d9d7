"""The part walk: which parts are body text, attachments, signatures or ciphertext.

`walk_message` visits the MIME tree under the limits (`MAX_DEPTH`, `MAX_PARTS`) and fills a `WalkState`;
`intake.mime.parse.parse_message` turns that into a `ParsedMessage`.
"""

from __future__ import annotations

import hashlib
from email.message import EmailMessage, Message
from email.parser import BytesParser
from typing import TYPE_CHECKING, cast

from . import cms, messageparts, tnef
from .body import add_text, alternative_rank, append_text, drop_text, html_instead_of_stub
from .external import external_file_line
from .headers import clean_filename, content_type_param, part_filename
from .limits import MAX_ALTERNATIVES, MAX_BOUNDARY_LINES, MAX_DEPTH, MAX_PARTS, MAX_SIGNATURES
from .message import Alternative, Attachment, Signature, add_defect
from .parts import TnefMember, decoded_part_bytes, message_file_name, part_content_type, part_name, record_attachment
from .policy import PARSE_POLICY
from .sniff import sniff_type

if TYPE_CHECKING:
    from .parts import AttachmentPart

# Report parts: data about a message, not content (DSNs, MDNs, abuse reports).
_REPORT_TYPES = frozenset(
    {
        "message/delivery-status",
        "message/disposition-notification",
        "message/feedback-report",
        "text/rfc822-headers",
        "message/global-delivery-status",
        "message/global-disposition-notification",
        "message/global-headers",
    }
)
# Codecs that are text encodings in Python's eyes but never a mail charset, and
_SIGNATURE_TYPES = {
    "application/pgp-signature": "pgp",
    "application/pkcs7-signature": "smime",
    "application/x-pkcs7-signature": "smime",
}
_PKCS7_MIME_TYPES = frozenset({"application/pkcs7-mime", "application/x-pkcs7-mime"})
_ENCRYPTED_SMIME_KINDS = frozenset({"enveloped-data", "authenveloped-data"})
_TNEF_TYPES = frozenset({"application/vnd.ms-tnef", "application/ms-tnef"})
# Other renderings of the body in multipart/alternative (Gmail AMP, Apple Watch): neither body nor file.
_RENDERING_TYPES = frozenset({"text/x-amp-html", "text/watch-html"})
# Attached messages: listed as one file, the files inside them listed too (nested).
_ATTACHED_MESSAGE_TYPES = frozenset({"message/rfc822", "message/global", "message/news"})
# text/* types that are data or code rather than a body, listed as files even without a filename.
_TEXT_NOT_BODY = frozenset(
    {
        "text/calendar",
        "text/x-vcalendar",
        "text/vcard",
        "text/x-vcard",
        "text/directory",
        "text/css",
        "text/javascript",
        "text/ecmascript",
        "text/x-amp-html",
        "text/watch-html",
        "text/rfc822-headers",
    }
)


class WalkState:
    def __init__(self, defects: list[str]) -> None:
        self.defects = defects
        self.text: list[str] = []
        self.text_sources: list[str] = []  # "plain", "html" or "rtf", one for each entry of `text`
        self.text_chars = 0
        self.truncated = False  # some body text was cut or left out
        self.attachments: list[tuple[tuple[int, ...], Attachment, AttachmentPart]] = []
        self.parts = 0
        self.too_complex = False
        # Inline text parts with a filename: attachments, and the body if there is no other.
        self.fallback_text: list[tuple[Message, str]] = []
        # Bodies found in winmail.dat parts, (text, source): the body if there is no other.
        self.tnef_bodies: list[tuple[str, str]] = []
        self.signatures: list[Signature] = []
        self.encrypted = ""
        self.alternatives: list[Alternative] = []
        # id(part) -> (text, cut) of HTML parts converted so far: the alternative choice may convert one early.
        self.html_text: dict[int, tuple[str, bool]] = {}
        self.root: Message | None = None  # the message walked (message/partial pieces are looked up in it)
        # message/partial pieces by id and number, found on first need.
        self.partials: dict[str, dict[int, Message]] | None = None
        # Attached messages (message/news, reassembled message/partial) whose text is the body if there is no other.
        self.message_bodies: list[Message] = []
        self.multiparts: list[Message] = []  # the multipart parts enclosing the part being walked
        self.smime_certs_only = False
        self.reparse = True  # False when only the headers were parsed (nothing to look at again)


def _walk_alternative(walk: WalkState, children: list[Message], depth: int, path: tuple[int, ...]) -> None:
    """multipart/alternative as the body: the first part with text in the order plain, multipart, HTML,
    except that a plain stub gives way to the HTML (`intake.mime.alternatives`). Every alternative is recorded."""
    types = [part_content_type(child) for child in children]
    # (index, rank) in the order tried, stable; other renderings (AMP, ...) are never read nor listed.
    ranked = sorted(
        (
            (index, alternative_rank(ctype))
            for index, ctype in enumerate(types)
            if ctype not in _RENDERING_TYPES or children[index].is_multipart()
        ),
        key=lambda item: item[1],
    )
    chars: dict[int, int] = {}  # readable characters of the alternatives that were read
    walked = {index for index, ctype in enumerate(types) if ctype in _RENDERING_TYPES}
    chosen, start = None, len(walk.text)
    for index, _rank in ranked:
        start = len(walk.text)
        walked.add(index)
        walk_message(walk, children[index], depth + 1, "body", path + (index,))
        chars[index] = sum(len(text) for text in walk.text[start:])
        if len(walk.text) > start:
            chosen = index
            break
    if chosen is not None and types[chosen] == "text/plain":
        html_index = html_instead_of_stub(walk, children, ranked, chosen, start, chars)
        if html_index is not None:
            stub = (walk.text[start:], walk.text_sources[start:], walk.truncated)
            drop_text(walk, start)
            walked.add(html_index)
            walk_message(walk, children[html_index], depth + 1, "body", path + (html_index,))
            if len(walk.text) > start:
                chosen = html_index
                chars[html_index] = sum(len(text) for text in walk.text[start:])
            else:  # nothing came of it after all: keep the plain text
                walk.text[start:], walk.text_sources[start:], walk.truncated = stub
                walk.text_chars += sum(len(text) for text in stub[0])
    for index, child in enumerate(children):
        if index not in walked:
            walk_message(walk, child, depth + 1, "alternate", path + (index,))
    for index, ctype in enumerate(types[:MAX_ALTERNATIVES]):
        walk.alternatives.append({"type": ctype, "chars": chars.get(index), "chosen": index == chosen})


def _record_signature(walk: WalkState, part: Message, protocol: str, ctype: str, data: bytes | None = None) -> None:
    if len(walk.signatures) >= MAX_SIGNATURES:
        return
    if data is None:
        try:
            data = decoded_part_bytes(part)
        except Exception:
            data = b""
    walk.signatures.append(
        {"protocol": protocol, "type": ctype, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    )


def _walk_signed(walk: WalkState, children: list[Message], depth: int, role: str, path: tuple[int, ...]) -> None:
    """multipart/signed: the content is walked as usual; the signature part is recorded, not listed
    (an attached message's signature is not recorded: it is about that message, listed as a whole)."""
    for index, child in enumerate(children):
        ctype = part_content_type(child)
        protocol = _SIGNATURE_TYPES.get(ctype) if index and not child.is_multipart() else None
        if protocol is None:
            walk_message(walk, child, depth + 1, role, path + (index,))
        elif _count_part(walk) and role != "nested":
            _record_signature(walk, child, protocol, ctype)


def _walk_encrypted(walk: WalkState, children: list[Message], role: str, path: tuple[int, ...]) -> None:
    """multipart/encrypted (PGP/MIME): a control part ("Version: 1"), then the ciphertext, kept for a person."""
    walk.encrypted = walk.encrypted or "pgp"
    for index, child in enumerate(children):
        if not _count_part(walk):
            return
        ctype = part_content_type(child)
        if ctype == "application/pgp-encrypted" and not child.is_multipart():
            continue
        record_attachment(
            walk,
            child,
            path + (index,),
            ctype,
            child.get_content_disposition(),
            part_name(child, ctype, part_filename(child)),
            role == "nested",
            origin="encrypted",
        )


def _smime_type(part: Message) -> str:
    return content_type_param(part, "smime-type").lower()


def _is_smime_p7m(filename: str | None) -> bool:
    return bool(filename) and str(filename).strip().lower() == "smime.p7m"


def _unwrap_signed_data(walk: WalkState, data: bytes, depth: int) -> Message | None:
    """The MIME entity inside opaque S/MIME signed data, parsed; None if it cannot be had."""
    if depth + 1 > MAX_DEPTH:
        add_defect(walk.defects, "DepthLimitExceeded")
        walk.too_complex = True
        return None
    content = cms.signed_content(data)
    if content is None:
        add_defect(walk.defects, "UnreadableSignedData")
        return None
    return _parsed(walk, content, depth)


def _walk_pkcs7(
    walk: WalkState,
    part: Message,
    depth: int,
    role: str,
    path: tuple[int, ...],
    ctype: str,
    disposition: str | None,
    filename: str | None,
) -> None:
    """S/MIME application/pkcs7-mime. Opaque signed data is unwrapped and its content walked in its place
    (the blob recorded as a signature); enveloped data, or signed data that cannot be unwrapped, is
    encrypted mail: the blob is listed with origin "encrypted" for a person. Other kinds (certs-only)
    are ordinary files."""
    try:
        data = decoded_part_bytes(part)
    except Exception as exc:
        add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    kind = _smime_type(part) or cms.content_kind(data)
    name = part_name(part, ctype, filename)
    if kind == "certs-only" or (kind == "signed-data" and cms.is_certs_only(data)):
        # Certificates only (smime.p7c: a correspondent's certificate, as Outlook sends it): a file.
        walk.smime_certs_only = True
        record_attachment(walk, part, path, ctype, disposition, name or "smime.p7c", role == "nested", data=data)
        return
    if kind == "signed-data":
        if role != "nested":
            _record_signature(walk, part, "smime", ctype, data)
        inner = _unwrap_signed_data(walk, data, depth)
        if inner is not None:
            walk_message(walk, inner, depth + 1, role, path + (0,))
            return
    elif kind not in _ENCRYPTED_SMIME_KINDS and not (not kind and _is_smime_p7m(filename)):
        record_attachment(walk, part, path, ctype, disposition, name, role == "nested", data=data)
        return
    walk.encrypted = walk.encrypted or "smime"
    record_attachment(walk, part, path, ctype, disposition, name, role == "nested", origin="encrypted", data=data)


def _add_tnef(
    walk: WalkState,
    part: Message,
    role: str,
    path: tuple[int, ...],
    ctype: str,
    disposition: str | None,
    filename: str | None,
) -> None:
    """A winmail.dat is listed as the files inside it (origin "tnef"), and its body kept in case there is
    no other. One that cannot be unpacked is listed as itself: the default policy refuses its type, so a
    person looks at it."""
    from . import containers  # here, not at the top: this function's own dependency (archives, .msg)

    try:
        data = decoded_part_bytes(part)
    except Exception as exc:
        add_defect(walk.defects, f"UndecodablePart:{type(exc).__name__}")
        data = b""
    unpacked = tnef.unpack(data) if data else None
    if unpacked is None:
        add_defect(walk.defects, "UnreadableTnef")
        record_attachment(
            walk, part, path, ctype, disposition, part_name(part, ctype, filename), role == "nested", data=data
        )
        return
    for index, member in enumerate(unpacked.members):
        attachment = Attachment(
            filename=clean_filename(member.name),
            declared_type=member.mime_type or "application/octet-stream",
            sniffed_type=sniff_type(member.data, declared_type=member.mime_type, filename=member.name),
            size=len(member.data),
            sha256=hashlib.sha256(member.data).hexdigest(),
            content_id="",
            is_inline=False,
            nested=role == "nested",
            origin="tnef",
        )
        stand_in, position = TnefMember(part, index), len(walk.attachments)
        walk.attachments.append((path + (index,), attachment, stand_in))
        # An archive or a .msg inside the winmail.dat: its files are listed after it too.
        listed = containers.expand(walk, part=stand_in, path=path + (index,), attachment=attachment, data=member.data)
        if listed is not attachment:
            walk.attachments[position] = (path + (index,), listed, stand_in)
    if role == "body" and unpacked.body:
        walk.tnef_bodies.append((unpacked.body, unpacked.body_source))


def _count_part(walk: WalkState) -> bool:
    """Count one more part; False once `MAX_PARTS` is passed (the walk stops there)."""
    walk.parts += 1
    if walk.parts <= MAX_PARTS:
        return True
    if not walk.too_complex:
        add_defect(walk.defects, "PartLimitExceeded")
    walk.too_complex = True
    return False


def walk_message(walk: WalkState, part: Message, depth: int, role: str, path: tuple[int, ...]) -> None:
    """Visit one part. `role`: "body" (text counts), "alternate" (a rejected alternative) or "nested"."""
    if not _count_part(walk):
        return
    if depth:
        for defect in getattr(part, "defects", ())[:10]:
            add_defect(walk.defects, type(defect).__name__)
    ctype = part_content_type(part)
    maintype = ctype.split("/", 1)[0]
    if part.is_multipart():
        children = cast("list[Message]", part.get_payload())  # a multipart's payload: its parts
        if maintype == "message":
            if ctype in _ATTACHED_MESSAGE_TYPES:
                name = part_name(part, ctype, part_filename(part)) or message_file_name(part)
                record_attachment(walk, part, path, ctype, part.get_content_disposition(), name, role == "nested")
                if ctype == "message/news" and role == "body" and children:
                    walk.message_bodies.append(children[0])
                role = "nested"
            elif ctype == "message/partial":
                _walk_partial(walk, part, depth, role, path)
                return
            elif ctype == "message/external-body":
                if role == "body":  # a pointer, never fetched: where the file is, for a person
                    append_text(walk, external_file_line(part), "plain")
                return
            else:
                return  # delivery-status and other report data
        if depth + 1 > MAX_DEPTH:
            if not walk.too_complex:
                add_defect(walk.defects, "DepthLimitExceeded")
            walk.too_complex = True
            return
        if ctype == "multipart/signed":
            _walk_signed(walk, children, depth, role, path)
        elif ctype == "multipart/encrypted":
            _walk_encrypted(walk, children, role, path)
        elif ctype == "multipart/alternative" and role == "body":
            walk.multiparts.append(part)
            _walk_alternative(walk, children, depth, path)
            walk.multiparts.pop()
        else:
            walk.multiparts.append(part)
            for index, child in enumerate(children):
                walk_message(walk, child, depth + 1, role, path + (index,))
            walk.multiparts.pop()
        return

    disposition = part.get_content_disposition()
    filename = part_filename(part)
    if ctype in _REPORT_TYPES:
        return
    if maintype == "multipart":
        # A multipart whose boundary never shows: the one its body really uses, else its raw body as text.
        inner = _with_found_boundary(walk, part, depth)
        if inner is not None:
            walk_message(walk, inner, depth + 1, role, path + (0,))
        elif role == "body":
            add_text(walk, part, "text/plain")
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
                add_text(walk, part, ctype)
            return
        if role == "body" and disposition == "inline" and len(walk.fallback_text) < 10:
            walk.fallback_text.append((part, ctype))
    elif (
        (maintype == "text" or ctype == "application/plain")
        and disposition != "attachment"
        and not filename
        and ctype not in _TEXT_NOT_BODY
    ):
        # Another text type as the body (text/enriched, text/richtext, application/plain in PGP/MIME).
        if role == "body":
            add_text(walk, part, ctype)
        return
    protocol = _SIGNATURE_TYPES.get(ctype) if ctype != "application/pgp-signature" else None
    if protocol or (ctype == "application/octet-stream" and str(filename or "").strip().lower() == "smime.p7s"):
        # An S/MIME signature outside multipart/signed (some gateways re-wrap signed mail in multipart/mixed).
        if role != "nested":
            _record_signature(walk, part, "smime", ctype)
        return
    record_attachment(walk, part, path, ctype, disposition, part_name(part, ctype, filename), role == "nested")


def _walk_partial(walk: WalkState, part: Message, depth: int, role: str, path: tuple[int, ...]) -> None:
    """message/partial: with every piece in the mail, the first stands for the reassembled message (an
    attached message, as message/rfc822) and the others are skipped; else each piece is a file."""
    if walk.partials is None:
        walk.partials = messageparts.partial_groups(walk.root if walk.root is not None else part, MAX_PARTS)
    pid, number, total = messageparts.partial_info(part)
    pieces = walk.partials.get(pid, {})
    if pid and messageparts.is_complete(pieces, total):
        if number != 1 or pieces.get(1) is not part:
            return
        inner = _parsed(walk, messageparts.reassembled(pieces, total), depth)
        if inner is not None:
            wrapper = EmailMessage(policy=PARSE_POLICY)
            wrapper["Content-Type"] = "message/rfc822"
            wrapper.set_payload([inner])
            record_attachment(
                walk, wrapper, path, "message/rfc822", "attachment", message_file_name(wrapper), role == "nested"
            )
            if role == "body":
                walk.message_bodies.append(inner)
            walk_message(walk, inner, depth + 1, "nested", path + (0,))
            return
    name = part_name(part, "message/partial", part_filename(part)) or f"partial {number or '?'} of {total or '?'}.eml"
    record_attachment(walk, part, path, "message/partial", part.get_content_disposition(), name, role == "nested")


def _parsed(walk: WalkState, data: bytes, depth: int) -> Message | None:
    """`data` parsed as a MIME entity under the walk's limits; None if it cannot be."""
    if depth + 1 > MAX_DEPTH:
        add_defect(walk.defects, "DepthLimitExceeded")
        walk.too_complex = True
        return None
    if data.count(b"\n--") > MAX_BOUNDARY_LINES:
        add_defect(walk.defects, "TooManyBoundaryLines")
        walk.too_complex = True
        return None
    try:
        return BytesParser(policy=PARSE_POLICY).parsebytes(data)
    except Exception as exc:
        add_defect(walk.defects, f"Unparseable:{type(exc).__name__}")
        return None


def _with_found_boundary(walk: WalkState, part: Message, depth: int) -> Message | None:
    """A multipart whose declared boundary never shows, parsed again with the one its body uses; or None."""
    if not walk.reparse:
        return None
    try:
        body = part.get_payload(decode=True)
    except Exception:
        return None
    if not isinstance(body, bytes) or b"--" not in body:
        return None
    boundary = messageparts.found_boundary(body)
    if boundary is None or boundary == part.get_boundary():
        return None
    header = f'Content-Type: {part.get_content_type()}; boundary="{boundary}"\r\n\r\n'.encode("ascii", "replace")
    inner = _parsed(walk, header + body, depth)
    if inner is None or not inner.is_multipart():
        return None
    add_defect(walk.defects, "BoundaryMismatch")
    return inner
