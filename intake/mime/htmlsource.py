"""The HTML of a message's body, as sent: the first text/html part that is the body (not an attachment,
not inside an attached message), for desks that take HTML (sanitized by `ticketing.rich_body`)."""

from typing import TYPE_CHECKING, cast

from .body import MAX_HTML_BYTES
from .headers import decode_bytes
from .message import ParsedMessage

if TYPE_CHECKING:
    from email.message import Message

MAX_PARTS_LOOKED_AT = 200


def html_source(parsed: ParsedMessage) -> str:
    """The body's HTML, at most MAX_HTML_BYTES of it; "" when the body has none (or only plain text was
    chosen because the message has no HTML)."""
    message = parsed._message
    if message is None or "html" not in parsed.body_source:
        return ""
    stack, looked = [message], 0
    while stack and looked < MAX_PARTS_LOOKED_AT:
        part = stack.pop(0)
        looked += 1
        ctype = part.get_content_type()
        if part.is_multipart():
            if ctype == "message/rfc822":
                continue
            stack[0:0] = list(cast("list[Message]", part.get_payload()) or [])  # a multipart's parts
            continue
        if ctype != "text/html" or part.get_content_disposition() == "attachment":
            continue
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes) or not data:
            continue
        return decode_bytes(data[:MAX_HTML_BYTES], part.get_content_charset())
    return ""
