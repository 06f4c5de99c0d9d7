"""Stable keys: the same message always yields the same key, whichever channel brought it."""

import hashlib
import re
from typing import Protocol

_SEP = "\x1f"
_MAX_ID_LENGTH = 900


def stable_key(*parts: object) -> str:
    return hashlib.sha256(_SEP.join(str(p) for p in parts).encode("utf-8", "surrogateescape")).hexdigest()


def dedupe_key(tenant_id: int, mailbox_id: int, provider_message_id: str, action_type: str = "ingest") -> str:
    return stable_key(tenant_id, mailbox_id, provider_message_id, action_type)


# What identifies a message's content however it travelled: the author's headers and the body.
# Transport headers (Received, Delivered-To, Return-Path, a provider's own) are left out, so
# the same message fetched by IMAP and posted by a webhook agrees; folding, line endings
# and trailing white space are normalised for the same reason.
FINGERPRINT_HEADERS = (b"message-id", b"date", b"from", b"to", b"cc", b"subject")
_HEADER_END = re.compile(rb"\r?\n\r?\n")
_FOLD = re.compile(rb"\r?\n(?=[ \t])")
_SPACES = re.compile(rb"\s+")
_HEADER_NAME = re.compile(rb"[!-9;-~]+")
# Reading more of a header block than this costs time and says nothing more about identity.
_MAX_FINGERPRINT_HEADER_BYTES = 256 * 1024


def content_fingerprint(raw: bytes) -> str:
    """sha256 hex of what the author wrote: Message-ID, Date, From, To, Cc, Subject and the body.

    The same for the same message whichever channel brought it, different for two
    messages that merely share a Message-ID (some senders reuse one for every alert).
    """
    match = _HEADER_END.search(raw, 0, _MAX_FINGERPRINT_HEADER_BYTES)
    if match is None:
        head, body_start = raw[:_MAX_FINGERPRINT_HEADER_BYTES], _MAX_FINGERPRINT_HEADER_BYTES
    else:
        head, body_start = raw[: match.start()], match.end()
    wanted: dict[bytes, list[bytes]] = {}
    other: list[bytes] = []
    for line in _FOLD.sub(b" ", head).splitlines():
        name, colon, value = line.partition(b":")
        name = name.strip().lower()
        if colon and _HEADER_NAME.fullmatch(name):
            if name in FINGERPRINT_HEADERS:
                wanted.setdefault(name, []).append(b" ".join(_SPACES.split(value.strip())))
        elif line.strip():
            # Not a header at all (junk, or bytes that are no message): content, so it counts.
            other.append(line.rstrip())
    digest = hashlib.sha256()
    digest.update(b"\x1e".join(other) + b"\x1f")
    for name in FINGERPRINT_HEADERS:
        digest.update(name + b":" + b"\x1e".join(wanted.get(name, ())) + b"\x1f")
    _digest_body(digest, raw, body_start)
    return digest.hexdigest()


_BODY_PIECE = 64 * 1024


class _Digest(Protocol):
    """What `_digest_body` feeds: a hashlib object (hashlib does not expose their class)."""

    def update(self, data: bytes, /) -> None: ...


def _digest_body(digest: _Digest, raw: bytes, start: int) -> None:
    """Feed the body `raw[start:]` with CRLF as LF, no white space at line ends and none at the end.

    Line by line (`rstrip` of each line is CRLF -> LF plus trailing spaces removed), in pieces of whole
    lines: a large message is never copied whole, and that is faster than a regular expression too.
    Only newlines can end a piece once its lines are stripped: those are held back until more text
    follows, so the ones at the very end are dropped.
    """
    held = 0
    end = len(raw)
    while start < end:
        stop = raw.find(b"\n", min(start + _BODY_PIECE, end))
        stop = end if stop == -1 else stop + 1
        text = b"\n".join([line.rstrip(b" \t\r") for line in raw[start:stop].split(b"\n")])
        kept = text.rstrip(b"\n")
        if kept:
            digest.update(b"\n" * held + kept if held else kept)
            held = len(text) - len(kept)
        else:
            held += len(text)
        start = stop


def reused_id(provider_message_id: str, fingerprint: str) -> str:
    """The provider message id of a message that reuses another message's id: both, combined."""
    return f"{provider_message_id}#{fingerprint[:16]}"


def message_id_from_raw(raw: bytes) -> str:
    """The RFC 5322 Message-ID without angle brackets, or "" when absent or unusable.

    Read by the same header-block parse (and id cleaning) as the thread key, so the
    provider message id and the thread key of a message always agree.
    """
    from .mime import thread_ids

    return thread_ids(raw)[0]


def provider_message_id_for_raw(raw: bytes, claimed: str = "", message_id: str | None = None) -> str:
    """For raw and inbound-parse mail and IMAP: the Message-ID, else the content fingerprint.

    Never subject + sender: two real requests may look identical.
    """
    candidate = (claimed or "").strip() or (message_id if message_id is not None else message_id_from_raw(raw))
    if not candidate:
        # The content fingerprint, not a hash of the bytes: channels differ in transport
        # headers and line endings (IMAP servers answer CRLF and add Received/Delivered-To,
        # webhooks often send LF), and both must meet at one key.
        return "sha256:" + content_fingerprint(raw)
    if len(candidate) > _MAX_ID_LENGTH:
        return "sha256-id:" + hashlib.sha256(candidate.encode("utf-8", "surrogateescape")).hexdigest()
    return candidate


def thread_key_for_raw(raw: bytes, ids: tuple[str, str, list[str]] | None = None) -> str:
    """The thread key `intake.validation.thread_key` gives the parsed message, from headers alone.

    `ids` is what `intake.mime.thread_ids(raw)` returned, when the caller has it already.
    """
    from .mime import thread_ids
    from .validation.threading import thread_key_of

    message_id, in_reply_to, references = ids if ids is not None else thread_ids(raw)
    return thread_key_of(message_id, in_reply_to, references, hashlib.sha256(raw).hexdigest())


def raw_message_keys(raw: bytes, claimed_id: str = "") -> tuple[str, str]:
    """(provider message id, thread key) of a raw message from one read of its header block."""
    from .mime import thread_ids

    ids = thread_ids(raw)
    return provider_message_id_for_raw(raw, claimed_id, message_id=ids[0]), thread_key_for_raw(raw, ids)
