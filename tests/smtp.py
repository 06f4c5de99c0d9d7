"""A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps what it receives."""

import email
from contextlib import contextmanager
from email import policy

import pytest
from aiosmtpd.controller import Controller

from tests.live import free_port


class Inbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"


@contextmanager
def serving(settings, handler, *, smtputf8: bool = False):
    """`handler` as an aiosmtpd server on 127.0.0.1 (SMTPUTF8 in its EHLO answer or not), Django's SMTP
    backend pointed at it."""
    controller = Controller(handler, hostname="127.0.0.1", port=free_port(), enable_SMTPUTF8=smtputf8)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    try:
        yield handler
    finally:
        controller.stop()


@pytest.fixture
def smtp_server(settings):
    with serving(settings, Inbox()) as inbox:
        yield inbox
