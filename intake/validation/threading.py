"""Thread keys and subject ticket tokens: which conversation a message belongs to. Pure, no I/O.

thread_key(parsed) -> str                            # 64 hex characters
subject_ticket_token(subject) -> str | None          # "[#MR-1234]" -> "MR-1234"
"""

from __future__ import annotations

import hashlib
import re

from ..mime import ParsedMessage

_TICKET_TOKEN = re.compile(r"\[#\s*([A-Za-z][A-Za-z0-9]{0,15}-[0-9]{1,12})\s*\]")


def thread_key(parsed: ParsedMessage) -> str:
    """sha256 hex (64 chars) of the thread's root Message-ID.

    Root: the first References id, else In-Reply-To, else the message's own
    Message-ID; a reply and the message it answers get the same key. Without any
    of them the message is a thread of its own: the key comes from the raw bytes.
    """
    return thread_key_of(parsed.message_id, parsed.in_reply_to, parsed.references, parsed.raw_sha256)


def thread_key_of(message_id: str, in_reply_to: str, references: list[str], raw_sha256: str) -> str:
    root = (references[0] if references else "") or in_reply_to or message_id
    if not root:
        root = "raw:" + (raw_sha256 or "")
    return hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()


def subject_ticket_token(subject: str, prefix: str | None = None) -> str | None:
    """The first ticket token like "[#MR-1234]" in a subject, as "MR-1234"; None if there is none.

    With `prefix`, only tokens with that prefix (case-insensitive) count.
    """
    for match in _TICKET_TOKEN.finditer(subject or ""):
        token = match.group(1).upper()
        if prefix is None or token.split("-", 1)[0] == prefix.upper():
            return token
    return None
