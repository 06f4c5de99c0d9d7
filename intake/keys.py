"""Stable keys: the same message always yields the same key, whichever channel brought it."""
import hashlib

_SEP = "\x1f"
_MAX_ID_LENGTH = 900


def stable_key(*parts) -> str:
    return hashlib.sha256(_SEP.join(str(p) for p in parts).encode("utf-8", "surrogateescape")).hexdigest()


def dedupe_key(tenant_id: int, mailbox_id: int, provider_message_id: str, action_type: str = "ingest") -> str:
    return stable_key(tenant_id, mailbox_id, provider_message_id, action_type)


def message_id_from_raw(raw: bytes) -> str:
    """The RFC 5322 Message-ID without angle brackets, or "" when absent or unusable.

    Read by the same header-block parse (and id cleaning) as the thread key, so the
    provider message id and the thread key of a message always agree.
    """
    from .mime import thread_ids

    return thread_ids(raw)[0]


def provider_message_id_for_raw(raw: bytes, claimed: str = "", message_id: str | None = None) -> str:
    """For raw and inbound-parse mail and IMAP: the Message-ID, else sha256 of the bytes.

    Never subject + sender: two real requests may look identical.
    """
    candidate = (claimed or "").strip() or (message_id if message_id is not None else message_id_from_raw(raw))
    if not candidate:
        # Line endings differ by channel (IMAP servers answer CRLF, webhooks often send
        # LF): hash the message with one convention so both channels meet at one key.
        return "sha256:" + hashlib.sha256(raw.replace(b"\r\n", b"\n")).hexdigest()
    if len(candidate) > _MAX_ID_LENGTH:
        return "sha256-id:" + hashlib.sha256(candidate.encode("utf-8", "surrogateescape")).hexdigest()
    return candidate


def thread_key_for_raw(raw: bytes, ids: tuple | None = None) -> str:
    """The thread key `intake.validation.thread_key` gives the parsed message, from headers alone.

    `ids` is what `intake.mime.thread_ids(raw)` returned, when the caller has it already.
    """
    from .mime import thread_ids
    from .validation import thread_key_of

    message_id, in_reply_to, references = ids if ids is not None else thread_ids(raw)
    return thread_key_of(message_id, in_reply_to, references, hashlib.sha256(raw).hexdigest())


def raw_message_keys(raw: bytes, claimed_id: str = "") -> tuple[str, str]:
    """(provider message id, thread key) of a raw message from one read of its header block."""
    from .mime import thread_ids

    ids = thread_ids(raw)
    return provider_message_id_for_raw(raw, claimed_id, message_id=ids[0]), thread_key_for_raw(raw, ids)
