"""A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps each envelope as it came: MAIL FROM, its options,
RCPT TO and the bytes of the message. With or without SMTPUTF8 in its EHLO answer (RFC 6531).

    utf8_relay / ascii_relay        fixtures: Django's SMTP backend pointed at such a server
    relay_on(settings, smtputf8=)   the same as a context manager (a test with two relays)
"""

import email
from dataclasses import dataclass
from email import policy

import pytest

from tests.smtp import serving


@dataclass
class Received:
    mail_from: str
    mail_options: list
    rcpt_tos: list
    content: bytes

    @property
    def message(self):
        return email.message_from_bytes(self.content, policy=policy.SMTPUTF8)

    def header_bytes(self) -> bytes:
        return self.content.split(b"\r\n\r\n", 1)[0]


class Envelopes:
    def __init__(self):
        self.received: list[Received] = []

    async def handle_DATA(self, server, session, envelope):
        self.received.append(
            Received(
                envelope.mail_from,
                list(envelope.mail_options),
                list(envelope.rcpt_tos),
                bytes(envelope.original_content or envelope.content),
            )
        )
        return "250 OK"


def relay_on(settings, *, smtputf8: bool):
    return serving(settings, Envelopes(), smtputf8=smtputf8)


@pytest.fixture
def utf8_relay(settings):
    with relay_on(settings, smtputf8=True) as handler:
        yield handler


@pytest.fixture
def ascii_relay(settings):
    with relay_on(settings, smtputf8=False) as handler:
        yield handler
