"""message/external-body (RFC 2046 5.2.3, RFC 2017): a pointer to a file kept elsewhere, as Pine and
old Netscape sent large files. The pointer is written into the text as one line, for a person to
follow; intake never fetches it.

    external_file_line(part) -> str    "External file: <where> (<type>; access-type ...; size ...; expires ...)"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from .headers import content_type_param, decode_header_value

if TYPE_CHECKING:
    from email.message import Message

MAX_VALUE_CHARS = 500


def _parameter(part: Message, name: str) -> str:
    return decode_header_value(content_type_param(part, name), MAX_VALUE_CHARS)


def _location(part: Message, access: str) -> str:
    url = _parameter(part, "url")
    if url:
        # RFC 2017: a long URL may be split into several quoted strings, rejoined without the spaces.
        return "".join(url.replace('"', " ").split())
    name = _parameter(part, "name")
    site = _parameter(part, "site") or _parameter(part, "server")
    directory = _parameter(part, "directory")
    if access in ("anon-ftp", "ftp", "tftp") and site:
        path = "/".join(piece.strip("/") for piece in (directory, name) if piece)
        return f"{access}://{site}/{path}" if access != "anon-ftp" else f"ftp://{site}/{path}"
    where = name
    if directory:
        where = f"{directory.rstrip('/')}/{name}" if name else directory
    if site:
        where = f"{where} on {site}" if where else site
    if access == "mail-server":
        subject = _parameter(part, "subject")
        where = f"{where} (mail request{': ' + subject if subject else ''})" if where else "a mail server"
    return where or "(no location given)"


def external_file_line(part: Message) -> str:
    """One line that says where the external file is, what it is, and until when (see the module docstring)."""
    access = _parameter(part, "access-type").lower()
    details = []
    inner = part.get_payload()
    if isinstance(inner, list) and inner:
        entity = cast("Message", inner[0])  # the pointer's payload: the header of the external file
        try:
            content_type = entity.get_content_type()
        except Exception:
            content_type = ""
        if content_type and entity.get("Content-Type") is not None:
            details.append(content_type)
    details.append(f"access-type {access or 'unknown'}")
    size = _parameter(part, "size")
    if size:
        details.append(f"size {size} bytes" if size.isdigit() else f"size {size}")
    expiration = _parameter(part, "expiration")
    if expiration:
        details.append(f"expires {expiration}")
    return f"External file: {_location(part, access)} ({'; '.join(details)})"
