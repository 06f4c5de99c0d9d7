"""Requests from internationalised addresses (RFC 6531, RFC 6532), as an EAI client writes them."""

import idna

from tests.senderauth import stamped

JOSE = "josé@exämple.es"


def eai_request(sender: str, subject: str = "Impresora sin tóner") -> bytes:
    """A request as an EAI client (RFC 6532) writes it: UTF-8 in the header fields, the address as it is."""
    domain = sender.rpartition("@")[2]
    return stamped(
        (
            f"From: José Núñez <{sender}>\r\n"
            "To: support@acme.test\r\n"
            f"Subject: {subject}\r\n"
            # ASCII, as EAI clients write it (the domain in punycode): a UTF-8 Message-ID is not taken by intake.
            f"Message-ID: <eai-{abs(hash(sender))}@{idna.encode(domain, uts46=True).decode()}>\r\n"
            "Date: Wed, 02 Dec 2026 01:30:00 +0100\r\n"
            "MIME-Version: 1.0\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            "Content-Transfer-Encoding: 8bit\r\n"
            "\r\n"
            "La impresora de la segunda planta no imprime.\r\n"
        ).encode(),
        domain=domain,
    )
