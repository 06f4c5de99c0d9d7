"""Issue 20, finding 8: acknowledgments are no spam relay.

The attack: anyone writes `From: <victim>` and a subject of their choosing to a tenant's mailbox; Mailroom
made a ticket and mailed the victim an acknowledgment from the tenant's real address, echoing 200 characters
of the attacker's subject. Now an acknowledgment goes out only when a trusted Authentication-Results (the
mailbox's `trusted_authserv_id`) or the hosted provider's own verdict (Gmail, Graph, SES, Mailgun) shows
that the From domain passed DMARC, or SPF/DKIM for an aligned domain; every skip is audited; a tenant and a
recipient domain get at most so many an hour; and the subject is echoed only to an authenticated sender.

Every case runs the real pipeline (the signed raw webhook or `ingest`, normalization, the built-in
destination, the acknowledgment task) against a real SMTP server on 127.0.0.1.
"""

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from intake.keys import provider_message_id_for_raw
from intake.models import AuditEvent, InboxEvent, Mailbox, Tenant
from intake.services import ingest, record_audit
from intake.vocabulary import AuditKind
from tests.conftest import WEBHOOK_SECRET
from tests.factories import email_message, make_destination, make_mailbox, make_tenant
from tests.mail import webhook_headers
from tests.senderauth import TRUSTED_AUTHSERV_ID, stamped, trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from tests.support.api import API, api
from tests.support.users import make_user
from ticketing import ack_policy
from ticketing.models import Intent, Ticket, TicketMapping
from ticketing.services import process_inbox_event
from ticketing.tasks import process_inbox_events, send_acknowledgment

pytestmark = pytest.mark.usefixtures("scanner_off")

VICTIM = "ceo@bank.example"
ATTACKER_SUBJECT = "Your account is locked - verify at http://phish.example/login now"


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox):
    trust_our_mta(mailbox)


def post(body: bytes) -> int:
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202, response.content
    return response.json()["inbox_event_id"]


def send_all() -> None:
    for intent in Intent.objects.filter(action="notify_requester"):
        send_acknowledgment(intent.pk)
        send_acknowledgment(intent.pk)  # a redelivered task sends nothing twice


def deliver(body: bytes) -> int:
    """Through the signed raw webhook and the pipeline; then every acknowledgment there is, sent."""
    event_id = post(body)
    assert process_inbox_event(event_id) == "created"
    send_all()
    return event_id


def skip_detail(event_id) -> dict:
    [skipped] = AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped")
    return skipped.detail


def assert_ticket_but_no_acknowledgment(event_id, smtp_server, reason):
    mapping = TicketMapping.objects.get(inbox_event_id=event_id, action="create_ticket")
    assert Ticket.objects.filter(pk=int(mapping.ticket_id)).exists()  # the request is not lost
    assert smtp_server.messages == []
    assert not Intent.objects.filter(inbox_event_id=event_id, action="notify_requester").exists()
    assert skip_detail(event_id) == {"reason": reason}
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").exists()


def header(value: str) -> bytes:
    return f"Authentication-Results: {value}\n".encode()


def forged(**fields) -> bytes:
    return email_message(sender=f"Bank CEO <{VICTIM}>", subject=ATTACKER_SUBJECT, **fields)


# --- the attack: a forged From gets nothing -------------------------------------------------------------------

FORGERIES = {
    "no authentication results at all": lambda: forged(),
    "a perfect pass under an authserv-id nobody trusts": lambda: stamped(
        forged(), "bank.example", authserv_id="mx.evil.example"
    ),
    "Gmail's authserv-id on a mailbox that is not Gmail's": lambda: stamped(
        forged(), "bank.example", authserv_id="mx.google.com"
    ),
    "our MTA: SPF and DKIM pass, but for the attacker's domain": lambda: (
        header(
            f"{TRUSTED_AUTHSERV_ID}; spf=pass smtp.mailfrom=bounce@attacker.example;"
            " dkim=pass header.d=attacker.example;"
            " dmarc=none header.from=bank.example"
        )
        + forged()
    ),
    "our MTA: DKIM pass for a look-alike domain": lambda: (
        header(
            f"{TRUSTED_AUTHSERV_ID}; spf=fail smtp.mailfrom=bank.example;"
            " dkim=pass header.d=bank.example.attacker.test;"
            " dmarc=none header.from=bank.example"
        )
        + forged()
    ),
    "our MTA: a DMARC pass for another From domain": lambda: (
        header(f"{TRUSTED_AUTHSERV_ID}; dmarc=pass header.from=attacker.example") + forged()
    ),
    "our MTA: everything none": lambda: (
        header(f"{TRUSTED_AUTHSERV_ID}; spf=none smtp.mailfrom=bank.example; dkim=none; dmarc=none") + forged()
    ),
}


@pytest.mark.parametrize("case", list(FORGERIES))
def test_a_forged_from_gets_no_acknowledgment_and_the_skip_is_audited(smtp_server, case, caplog):
    event_id = deliver(FORGERIES[case]())
    assert InboxEvent.objects.get(pk=event_id).sender == VICTIM
    assert_ticket_but_no_acknowledgment(event_id, smtp_server, "unauthenticated_sender")
    # The attacker's text goes nowhere: not in the skip's audit row, not in the log.
    assert ATTACKER_SUBJECT not in json.dumps(skip_detail(event_id))
    assert "phish" not in caplog.text and VICTIM not in caplog.text


def test_a_mailbox_that_trusts_no_authserv_id_acknowledges_nobody(mailbox, smtp_server):
    mailbox.settings = {}
    mailbox.save()
    event_id = deliver(stamped(email_message(sender="jane@example.com")))  # a perfect pass, but believed by no one
    assert InboxEvent.objects.get(pk=event_id).auth_results == {}
    assert_ticket_but_no_acknowledgment(event_id, smtp_server, "unauthenticated_sender")


def test_a_sender_taken_from_reply_to_is_never_authenticated():
    # DMARC speaks for From; when From held no address, the sender is Sender's or Reply-To's: not vouched for.
    event = InboxEvent(
        sender=VICTIM,
        mailbox=Mailbox(settings={}),
        details={"sender_source": "reply-to"},
        auth_results={"dmarc": "pass", "dmarc.header.from": "bank.example"},
    )
    assert not ack_policy.sender_authentication(event).authenticated
    assert ack_policy.acknowledgment_skip_reason(event) == "unauthenticated_sender"
    event.details = {"sender_source": "from"}
    assert ack_policy.acknowledgment_skip_reason(event) is None


# --- a sender our MTA authenticated is acknowledged ---------------------------------------------------------------

AUTHENTICATED = {
    "DMARC pass": f"{TRUSTED_AUTHSERV_ID}; spf=pass smtp.mailfrom=example.com; dkim=pass header.d=example.com; "
    "dmarc=pass (p=reject) header.from=example.com",
    "DKIM pass, a subdomain signing": f"{TRUSTED_AUTHSERV_ID}; spf=fail smtp.mailfrom=example.com; "
    "dkim=fail header.d=attacker.example; dkim=pass header.d=mail.example.com; "
    "dmarc=none header.from=example.com",
    "SPF pass, the bounce domain a subdomain": f"{TRUSTED_AUTHSERV_ID}; spf=pass "
    "smtp.mailfrom=bounces@em.example.com; dkim=none; dmarc=none",
}


@pytest.mark.parametrize("case", list(AUTHENTICATED))
def test_an_authenticated_sender_is_acknowledged_with_their_subject(smtp_server, case):
    event_id = deliver(
        header(AUTHENTICATED[case]) + email_message(sender="Jane <jane@example.com>", subject="Printer on fire")
    )
    [ack] = smtp_server.messages
    mapping = TicketMapping.objects.get(inbox_event_id=event_id)
    assert ack["To"] == "jane@example.com" and ack["From"] == "support@acme.test"
    assert ack["Subject"] == f"[#MR-{mapping.pk}] Re: Printer on fire"
    assert not AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped").exists()
    assert AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledged").count() == 1


# --- the mailbox's override -------------------------------------------------------------------------------------


def test_ack_policy_always_is_honoured_only_where_the_platform_allows_it_and_never_echoes_a_stranger(
    mailbox, smtp_server, settings
):
    mailbox.settings = {**mailbox.settings, "ack_policy": "always"}
    mailbox.save()
    refused = deliver(forged())
    assert_ticket_but_no_acknowledgment(refused, smtp_server, "unauthenticated_sender")  # the platform says no

    settings.MAILROOM_ACK_ALLOW_UNAUTHENTICATED = True  # e.g. a closed system whose MTA writes no results
    allowed = deliver(forged(message_id="<second@bank.example>"))
    [ack] = smtp_server.messages
    mapping = TicketMapping.objects.get(inbox_event_id=allowed)
    assert ack["To"] == VICTIM and ack["Subject"] == f"[#MR-{mapping.pk}] We have received your request"
    assert "phish" not in ack.as_string() and "locked" not in ack.as_string()  # nothing the stranger wrote

    deliver(stamped(email_message(sender="jane@example.com", subject="Printer on fire")))
    assert smtp_server.messages[-1]["Subject"].endswith("Re: Printer on fire")  # an authenticated one: echoed


def test_ack_policy_never_and_acknowledge_false_are_the_same(mailbox, smtp_server):
    for policy in ({"ack_policy": "never"}, {"acknowledge": False}):
        mailbox.settings = {"trusted_authserv_id": TRUSTED_AUTHSERV_ID, **policy}
        mailbox.save()
        event_id = deliver(stamped(email_message(sender="jane@example.com")))
        assert_ticket_but_no_acknowledgment(event_id, smtp_server, "disabled")


def test_a_tenant_admin_cannot_open_the_relay_through_the_admin_or_the_api(tenant, smtp_server):
    """The tenant's `mailroom-admin` may set `ack_policy: always` (a mailbox setting), through the admin and
    the API alike; without the platform's consent it changes nothing: a forged From still gets no email."""
    own = make_mailbox(tenant, slug="help", address="help@acme.test", webhook_secret_ref="")
    admin_user = make_user("ann", groups=["mailroom-admin"], tenants=[tenant])
    response = api(admin_user).patch(
        f"{API}/mailboxes/{own.pk}/", {"settings": {"ack_policy": "always"}}, format="json"
    )
    assert response.status_code == 200, response.content
    browser = Client()
    browser.force_login(admin_user)
    response = browser.post(
        f"/admin/intake/mailbox/{own.pk}/change/",
        {
            "tenant": tenant.pk,
            "slug": "help",
            "address": "help@acme.test",
            "provider": "raw",
            "webhook_secret_ref": "",
            "credentials_ref": "",
            "allowed_recipients": "[]",
            "settings": json.dumps({"ack_policy": "always", "trusted_authserv_id": TRUSTED_AUTHSERV_ID}),
        },
    )
    assert response.status_code == 302, response.content[:2000]
    own.refresh_from_db()
    assert own.settings["ack_policy"] == "always"
    for n, raw in enumerate((forged(), stamped(forged(message_id="<b@bank.example>"), "attacker.example"))):
        event_id = ingest(own, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
        assert process_inbox_event(event_id) == "created"
        assert skip_detail(event_id) == {"reason": "unauthenticated_sender"}, n
    send_all()
    assert smtp_server.messages == []


# --- the hourly caps ---------------------------------------------------------------------------------------------


def authenticated_mail(n: int, domain: str = "example.com") -> bytes:
    return stamped(email_message(sender=f"person{n}@{domain}", subject=f"Question {n}"), domain)


def notified() -> list[str]:
    return sorted(
        InboxEvent.objects.filter(
            pk__in=Intent.objects.filter(action="notify_requester").values("inbox_event_id")
        ).values_list("sender", flat=True)
    )


def test_a_tenant_gets_at_most_its_hourly_number_of_acknowledgments(smtp_server, settings):
    settings.MAILROOM_ACK_PER_HOUR = 3
    ids = [deliver(authenticated_mail(n, "example.com" if n % 2 else "example.org")) for n in range(5)]
    assert len(smtp_server.messages) == 3
    assert [skip_detail(i) for i in ids[3:]] == [{"reason": "ack_rate_limited", "limit_per_hour": 3}] * 2
    # An hour later the tenant may acknowledge again.
    Intent.objects.filter(action="notify_requester").update(created_at=timezone.now() - timedelta(minutes=61))
    deliver(authenticated_mail(9))
    assert len(smtp_server.messages) == 4


def test_one_recipient_domain_gets_at_most_its_hourly_number(smtp_server, settings):
    settings.MAILROOM_ACK_PER_DOMAIN_PER_HOUR = 2
    ids = [deliver(authenticated_mail(n)) for n in range(3)] + [deliver(authenticated_mail(7, "other.example"))]
    assert sorted(m["To"] for m in smtp_server.messages) == [
        "person0@example.com",
        "person1@example.com",
        "person7@other.example",
    ]
    assert skip_detail(ids[2]) == {"reason": "ack_domain_rate_limited", "limit_per_hour": 2}


def test_the_tenants_own_setting_overrides_the_caps_and_tenants_are_counted_apart(mailbox, smtp_server, monkeypatch):
    Tenant.objects.filter(pk=mailbox.tenant_id).update(settings={"ack_per_hour": 1})
    deliver(authenticated_mail(1))
    second = deliver(authenticated_mail(2))
    assert skip_detail(second) == {"reason": "ack_rate_limited", "limit_per_hour": 1}
    other = make_tenant(slug="globex", domains=("globex.test",))
    make_destination(other)
    box = trust_our_mta(make_mailbox(other, slug="globex-help", address="help@globex.test"))
    raw = authenticated_mail(3)
    event_id = ingest(box, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
    assert process_inbox_event(event_id) == "created"
    send_all()
    assert notified() == ["person1@example.com", "person3@example.com"]
    assert len(smtp_server.messages) == 2


def test_the_caps_hold_when_a_group_is_processed_set_based(mailbox, settings):
    settings.MAILROOM_ACK_PER_HOUR = 2
    ids = [
        ingest(mailbox, provider_message_id_for_raw(raw), raw, source="raw").inbox_event_id
        for raw in (authenticated_mail(n) for n in range(5))
    ]
    assert process_inbox_events(ids) == {"created": 5}  # one group, one transaction: it counts its own
    assert len(notified()) == 2
    assert [skip_detail(i)["reason"] for i in ids[2:]] == ["ack_rate_limited"] * 3


# --- what hosted providers say --------------------------------------------------------------------------------

GMAIL_PASS = (
    "mx.google.com; dkim=pass header.i=@example.com header.s=20230601 header.b=kQ3v; spf=pass "
    "(google.com: domain of jane@example.com designates 209.85.128.41 as permitted sender) "
    "smtp.mailfrom=jane@example.com; dmarc=pass (p=NONE sp=NONE dis=NONE) header.from=example.com"
)
MICROSOFT_PASS = (
    "spf=pass (sender IP is 40.107.1.2) smtp.mailfrom=example.com; dkim=pass (signature was verified) "
    "header.d=example.com;dmarc=pass action=none header.from=example.com;compauth=pass reason=100"
)
MICROSOFT_NONE = (
    "spf=none (sender IP is 203.0.113.9) smtp.mailfrom=bank.example; dkim=none (message not signed) "
    "header.d=none;dmarc=none action=none header.from=bank.example;compauth=fail reason=001"
)


def lines(*headers: str) -> bytes:
    return "".join(f"{h}\n" for h in headers).encode()


PROVIDER_CASES = {
    "gmail: Google's pass": ("gmail", lines(f"Authentication-Results: {GMAIL_PASS}"), None, None),
    "gmail: Google's DMARC fail, a forged pass below it": (
        "gmail",
        lines(
            "Authentication-Results: mx.google.com; dmarc=fail (p=REJECT) header.from=example.com",
            f"Authentication-Results: {GMAIL_PASS}",
        ),
        None,
        "dmarc_fail",
    ),
    "graph: Exchange Online's pass (no authserv-id)": (
        "graph",
        lines(f"Authentication-Results: {MICROSOFT_PASS}"),
        None,
        None,
    ),
    "graph: Exchange's none on top, a forged pass below": (
        "graph",
        lines(f"Authentication-Results: {MICROSOFT_NONE}", f"Authentication-Results: {MICROSOFT_PASS}"),
        None,
        "unauthenticated_sender",
    ),
    "ses: the receipt's DMARC pass": ("ses", b"", {"dmarcVerdict": "PASS", "spfVerdict": "PASS"}, None),
    "ses: the receipt's DMARC fail": (
        "ses",
        lines("Authentication-Results: amazonses.com; dmarc=pass header.from=example.com"),
        {"dmarcVerdict": "FAIL"},
        "dmarc_fail",
    ),
    "ses: a gray receipt, SES's aligned SPF pass": (
        "ses",
        lines("Authentication-Results: amazonses.com; spf=pass smtp.mailfrom=jane@example.com; dkim=none"),
        {"dmarcVerdict": "GRAY"},
        None,
    ),
    "ses: a gray receipt and nothing else": (
        "ses",
        b"",
        {"dmarcVerdict": "GRAY", "spfVerdict": "PASS"},
        "unauthenticated_sender",
    ),
    "mailgun: Mailgun's DKIM pass for the one signing domain": (
        "mailgun",
        lines(
            "X-Mailgun-Dkim-Check-Result: Pass",
            "X-Mailgun-Spf: Pass",
            "DKIM-Signature: v=1; a=rsa-sha256; d=example.com; s=sel; h=from:subject; b=abc",
        ),
        None,
        None,
    ),
    "mailgun: a second verdict header (one is the sender's)": (
        "mailgun",
        lines(
            "X-Mailgun-Dkim-Check-Result: Fail",
            "X-Mailgun-Dkim-Check-Result: Pass",
            "DKIM-Signature: v=1; d=example.com; s=sel; b=abc",
        ),
        None,
        "unauthenticated_sender",
    ),
    "mailgun: a pass, but another domain signs too": (
        "mailgun",
        lines(
            "X-Mailgun-Dkim-Check-Result: Pass",
            "DKIM-Signature: v=1; d=example.com; s=a; b=x",
            "DKIM-Signature: v=1; d=attacker.example; s=b; b=y",
        ),
        None,
        "unauthenticated_sender",
    ),
    "mailgun: SPF pass alone (its domain is not vouched for)": (
        "mailgun",
        lines("X-Mailgun-Spf: Pass", "Return-Path: <jane@example.com>"),
        None,
        "unauthenticated_sender",
    ),
}


@pytest.mark.parametrize("case", list(PROVIDER_CASES))
def test_a_hosted_providers_own_verdict_decides(tenant, case):
    provider, on_top, receipt, reason = PROVIDER_CASES[case]
    box = Mailbox.objects.create(
        tenant=tenant, slug=f"{provider}-box", address=f"{provider}-box@acme.test", provider=provider
    )
    raw = on_top + email_message(sender="Jane <jane@example.com>", to=f"{provider}-box@acme.test")
    event_id = ingest(box, f"{provider}-id-1", raw, source=provider).inbox_event_id
    if receipt is not None:  # as the SES webhook keeps the SNS receipt, in the ingest's transaction
        record_audit(event_id, kind=AuditKind.PROVIDER_METADATA, actor=f"provider:{provider}", detail=receipt)
    assert process_inbox_event(event_id) == "created"
    planned = Intent.objects.filter(inbox_event_id=event_id, action="notify_requester").exists()
    if reason is None:
        assert (
            planned and not AuditEvent.objects.filter(inbox_event_id=event_id, kind="acknowledgment_skipped").exists()
        )
    else:
        assert not planned and skip_detail(event_id) == {"reason": reason}


def test_provider_headers_mean_nothing_on_a_raw_mailbox(smtp_server):
    # The same bytes that authenticate on a Gmail or Graph mailbox are just text on a raw one.
    for n, on_top in enumerate((GMAIL_PASS, MICROSOFT_PASS, "amazonses.com; dmarc=pass header.from=example.com")):
        event_id = deliver(
            lines(f"Authentication-Results: {on_top}", "X-Mailgun-Dkim-Check-Result: Pass")
            + email_message(sender="jane@example.com", message_id=f"<p{n}@example.com>")
        )
        assert skip_detail(event_id) == {"reason": "unauthenticated_sender"}
    assert smtp_server.messages == []


# --- alignment, pure ------------------------------------------------------------------------------------------


def test_alignment_is_relaxed_but_never_looser_than_dmarc():
    from intake.validation.authresults import aligned_method, domains_aligned, parse_authentication_results

    assert domains_aligned("example.com", "EXAMPLE.com.") and domains_aligned("mail.example.com", "example.com")
    assert domains_aligned("jane@example.com", "bounces.example.com")
    for a, b in (
        ("example.com", "example.org"),
        ("a.example.com", "b.example.com"),
        ("example.com", "com"),
        ("bank.example", "bank.example.attacker.test"),
        ("", "example.com"),
        ("notbank.example", "bank.example"),
    ):
        assert not domains_aligned(a, b), (a, b)
    assert aligned_method({"dmarc": "pass"}, "example.com") == "dmarc"
    assert aligned_method({"dmarc": "pass", "dmarc.header.from": "mail.example.com"}, "example.com") == ""
    assert aligned_method({"dkim": "pass", "dkim.header.i": "@em.example.com"}, "example.com") == "dkim"
    assert aligned_method({"spf": "pass", "spf.smtp.mailfrom": "x@evil.example"}, "example.com") == ""
    assert aligned_method({"spf": "softfail", "spf.smtp.mailfrom": "example.com"}, "example.com") == ""
    # Exchange Online writes no authserv-id: the first segment is a result, not a name.
    authserv_id, results = parse_authentication_results(MICROSOFT_PASS)
    assert authserv_id == "" and [m for m, _, _ in results] == ["spf", "dkim", "dmarc", "compauth"]
