"""Mail from a sender our MTA authenticated, as a real MTA marks it: acknowledgments go only to such senders.

    trust_our_mta(mailbox)                     # the mailbox believes Authentication-Results of TRUSTED_AUTHSERV_ID
    stamped(raw, "example.com")                # raw with our MTA's header on top (SPF, DKIM, DMARC pass)
    authentication_results("example.com", dmarc="fail", authserv_id="mx.evil.example")   # the header's value

The header goes on top of the message, where the last hop (our MTA) writes it (RFC 8601 §5).
"""

TRUSTED_AUTHSERV_ID = "mx.acme.test"


def trust_our_mta(mailbox, authserv_id: str = TRUSTED_AUTHSERV_ID):
    mailbox.settings = {**(mailbox.settings or {}), "trusted_authserv_id": authserv_id}
    mailbox.save()
    return mailbox


def authentication_results(
    domain: str = "example.com",
    *,
    authserv_id: str = TRUSTED_AUTHSERV_ID,
    spf: str = "pass",
    dkim: str = "pass",
    dmarc: str = "pass",
) -> str:
    return (
        f"{authserv_id}; spf={spf} smtp.mailfrom={domain}; dkim={dkim} header.d={domain}; "
        f"dmarc={dmarc} (p=reject dis=none) header.from={domain}"
    )


def stamped(raw: bytes, domain: str = "example.com", **results) -> bytes:
    """`raw` as our MTA hands it on: its Authentication-Results for `domain` prepended."""
    return f"Authentication-Results: {authentication_results(domain, **results)}\n".encode() + raw
