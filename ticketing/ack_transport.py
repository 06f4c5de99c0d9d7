"""Handing an acknowledgment to the relay, internationalised addresses (RFC 6531, RFC 6532) included, never mangled.

Django's EmailMessage writes every address through `sanitize_address`: a non-ASCII domain becomes
punycode (IDNA), which is right, but a non-ASCII local part becomes an RFC 2047 encoded-word
(`=?utf-8?b?...?=@example.es`), which is no address at all. So, by the addresses and what the relay's
EHLO offers:

    every address ASCII                  Django's path, as ever
    a non-ASCII address, relay SMTPUTF8  MAIL FROM ... SMTPUTF8 BODY=8BITMIME; the addresses and headers in
                                         UTF-8 (RFC 6532), with Django's headers, Message-ID and body
    an IDN domain only, no SMTPUTF8      Django's path, the domain first written in punycode by IDNA 2008
                                         (UTS 46): Django's own IDNA 2003 would send `faß.de` to `fass.de`
    a non-ASCII local part, no SMTPUTF8  nothing is sent (`NOT_DELIVERABLE`): no ASCII form of it exists

A backend that is not SMTP (file, console, memory) counts as a relay without SMTPUTF8.
"""

import smtplib
from email import policy
from email.message import EmailMessage as MIMEMessage
from email.utils import formataddr, formatdate, parseaddr

import idna  # IDNA 2008 (UTS 46); installed with requests
from django.conf import settings
from django.core.mail import EmailMessage

SENT = "sent"
NOT_DELIVERABLE = "not_deliverable"
UTF8_MAIL_OPTIONS = ["SMTPUTF8", "BODY=8BITMIME"]  # RFC 6531 requires 8BITMIME of an SMTPUTF8 server
# Lines as Django writes these headers: unfolded (a folded Message-ID reads back with a leading space).
UTF8_POLICY = policy.SMTPUTF8.clone(max_line_length=998)
# The headers written from the message's own fields; everything else comes from `extra_headers`.
_OWN_HEADERS = {"subject", "from", "to", "cc", "date"}


def bare_address(address: str) -> str:
    return parseaddr(address)[1] or address


def is_international(address: str) -> bool:
    return not bare_address(address).isascii()


def has_international_local_part(address: str) -> bool:
    return not bare_address(address).rpartition("@")[0].isascii()


def ascii_address(address: str) -> str:
    """`Jane <jane@faß.de>` -> `Jane <jane@xn--fa-hia.de>` (an ASCII local part; raises idna.IDNAError when the
    domain has no IDNA 2008 form)."""
    name, bare = parseaddr(address)
    local, _, domain = (bare or address).rpartition("@")
    ascii_domain = idna.encode(domain, uts46=True).decode("ascii") if not domain.isascii() else domain
    return formataddr((name, f"{local}@{ascii_domain}")) if name else f"{local}@{ascii_domain}"


def relay_takes_smtputf8(connection) -> bool:
    """Does the open connection's relay offer SMTPUTF8 (in its EHLO answer)?"""
    smtp = getattr(connection, "connection", None)
    if not isinstance(smtp, smtplib.SMTP):
        return False
    smtp.ehlo_or_helo_if_needed()
    return smtp.has_extn("smtputf8")


def utf8_bytes(message: EmailMessage) -> bytes:
    """`message` as Django would write it, but with its addresses and headers in UTF-8 (RFC 6532)."""
    mime = MIMEMessage(policy=UTF8_POLICY)
    mime["Subject"] = message.subject
    mime["From"] = message.from_email
    mime["To"] = ", ".join(message.to)
    if message.cc:
        mime["Cc"] = ", ".join(message.cc)
    mime["Date"] = formatdate(localtime=settings.EMAIL_USE_LOCALTIME)
    for name, value in message.extra_headers.items():
        if name.lower() not in _OWN_HEADERS:
            mime[name] = value
    mime.set_content(message.body, subtype="plain", charset="utf-8", cte="8bit")
    return mime.as_bytes()


def deliver(*, connection, message: EmailMessage) -> str:
    """Send `message` on the open `connection`: SENT, or NOT_DELIVERABLE when nothing was sent.

    Raises what the relay raises (smtplib's errors are OSErrors), as Django's own send does."""
    addresses = [message.from_email, *message.recipients()]
    if not any(is_international(address) for address in addresses):
        message.send()
        return SENT
    if relay_takes_smtputf8(connection):
        connection.connection.sendmail(
            bare_address(message.from_email),
            [bare_address(a) for a in message.recipients()],
            utf8_bytes(message),
            mail_options=UTF8_MAIL_OPTIONS,
        )
        return SENT
    if any(has_international_local_part(address) for address in addresses):
        return NOT_DELIVERABLE
    try:  # only domains are international: in punycode, Django's path then finds nothing to change
        message.from_email = ascii_address(message.from_email)
        message.to = [ascii_address(address) for address in message.to]
        message.cc = [ascii_address(address) for address in message.cc]
    except idna.IDNAError:
        return NOT_DELIVERABLE  # no ASCII form of the domain exists
    message.send()
    return SENT
