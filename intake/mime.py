"""Just enough MIME to route a message: headers and a readable text body.

Never raises: hostile or broken mail degrades to empty fields, and the
parser's defects are kept so that review can show what was wrong.
"""
from dataclasses import dataclass, field
from email import policy
from email.parser import BytesParser
from email.utils import getaddresses, parseaddr

MAX_DESCRIPTION_CHARS = 64 * 1024


@dataclass
class ParsedMessage:
    message_id: str = ""
    sender: str = ""
    recipients: list[str] = field(default_factory=list)
    subject: str = ""
    date: str = ""
    in_reply_to: str = ""
    references: list[str] = field(default_factory=list)
    text: str = ""
    defects: list[str] = field(default_factory=list)


def _header(message, name: str) -> str:
    try:
        value = message.get(name)
    except Exception as exc:  # a header the policy cannot fold or decode
        return ""
    return "" if value is None else str(value)


def _clean_id(value: str) -> str:
    return "".join(value.split()).strip("<>")


def _text_body(message) -> str:
    try:
        part = message.get_body(preferencelist=("plain", "html"))
        if part is None:
            return ""
        content = part.get_content()
    except Exception:
        return ""
    return content if isinstance(content, str) else ""


def parse_message(raw: bytes) -> ParsedMessage:
    parsed = ParsedMessage()
    try:
        message = BytesParser(policy=policy.default).parsebytes(raw)
    except Exception as exc:
        parsed.defects.append(f"unparseable: {type(exc).__name__}")
        return parsed
    parsed.defects = [type(d).__name__ for d in message.defects]
    parsed.message_id = _clean_id(_header(message, "Message-ID"))
    parsed.sender = parseaddr(_header(message, "From"))[1]
    parsed.recipients = [addr for _, addr in getaddresses([_header(message, "To"), _header(message, "Cc")]) if addr]
    parsed.subject = " ".join(_header(message, "Subject").split())
    parsed.date = _header(message, "Date")
    parsed.in_reply_to = _clean_id(_header(message, "In-Reply-To"))
    parsed.references = [_clean_id(r) for r in _header(message, "References").split() if r.strip("<>")]
    parsed.text = _text_body(message)[:MAX_DESCRIPTION_CHARS]
    return parsed
