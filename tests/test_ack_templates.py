"""Acknowledgment templates in the customer's words: the template for the language the mail is written in,
the "answer by" of the mailbox's business hours, and a sandbox that refuses loops when a template is saved
and bounds whatever is stored when it is rendered. Real PostgreSQL, a real SMTP server (tests/smtp.py)."""

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings as settings_module
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client
from hypothesis import HealthCheck, given, settings, strategies as st

from intake.models import AuditEvent, InboxEvent
from tests.conftest import WEBHOOK_SECRET
from tests.factories import email_message, make_mailbox, make_tenant
from tests.mail import webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp import smtp_server  # noqa: F401  (fixture)
from ticketing import ack_policy, ack_services, ack_templates
from ticketing.models import AcknowledgmentTemplate, BusinessHours, Intent, TicketMapping
from ticketing.services import process_inbox_event
from ticketing.tasks import send_acknowledgment

BERLIN = ZoneInfo("Europe/Berlin")
OFFICE = {day: [["09:00", "17:00"]] for day in ("mon", "tue", "wed", "thu", "fri")}
GERMAN_BODY = (
    "Sehr geehrte Damen und Herren,\n\n"
    "mein Drucker funktioniert seit gestern nicht mehr. Wenn ich ein Dokument drucken möchte, erscheint die "
    "Fehlermeldung „Papierstau“, obwohl kein Papier im Gerät steckt. Ich habe den Drucker bereits neu gestartet "
    "und den Treiber aktualisiert.\n\nKönnen Sie mir bitte helfen?\n\nMit freundlichen Grüßen\nJana Müller\n"
)
GERMAN_HTML = "<html><body><p>" + GERMAN_BODY.replace("\n\n", "</p><p>") + "</p></body></html>"
GERMAN = {
    "subject": "Ihre Anfrage {{ ticket_number }}: {{ subject }}",
    "body": (
        "Guten Tag {{ requester_name|default:'' }},\n\nwir haben Ihre Anfrage erhalten und unter "
        "{{ ticket_number }} aufgenommen.{% if answer_by %} Sie erhalten eine Antwort bis {{ answer_by }}."
        "{% endif %}\n\nUnsere Geschäftszeiten: {{ business_hours|default:'rund um die Uhr' }}\n\n"
        "-- \n{{ mailbox }}\n"
    ),
}
FRENCH = {
    "subject": "Votre demande {{ ticket_number }}",
    "body": "Bonjour,\n\nnous avons bien reçu votre demande ({{ ticket_number }}).\n",
}
ENGLISH = {
    "subject": "We have your request: {{ subject }}",
    "body": "Hello {{ requester_name|default:'there' }},\n\nthis is {{ ticket_number }}.\n",
}


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox, settings):
    settings.MAILROOM_CLAMD = "off"
    trust_our_mta(mailbox)


@pytest.fixture
def tenant_admin(tenant):
    user = get_user_model().objects.create_user("ada", "ada@staff.test", "pw-for-tests-only-42", is_staff=True)
    tenant.members.add(user)
    return user


def save(actor, tenant, mailbox=None, language="", **fields) -> AcknowledgmentTemplate:
    return ack_services.save_template(
        actor=actor, template=AcknowledgmentTemplate(tenant=tenant, mailbox=mailbox, language=language, **fields)
    )


def deliver(raw: bytes) -> int:
    """The message through the webhook, the pipeline and the acknowledgment task, as in production."""
    body = stamped(raw)
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202
    event_id = response.json()["inbox_event_id"]
    assert process_inbox_event(event_id) == "created"
    return event_id


def acknowledge(event_id: int, planned_at: datetime | None = None) -> str:
    intent = Intent.objects.get(inbox_event_id=event_id, action="notify_requester")
    if planned_at is not None:
        Intent.objects.filter(pk=intent.pk).update(created_at=planned_at)
    return send_acknowledgment(intent.pk)


def with_headers(raw: bytes, **headers) -> bytes:
    """`raw` with top-level headers such as Content-Language (which `set_content` would drop as a content
    header), where Outlook writes it."""
    return b"".join(f"{name.replace('_', '-')}: {value}\n".encode() for name, value in headers.items()) + raw


def german_mail(**headers) -> bytes:
    return with_headers(
        email_message(
            subject="Drucker druckt nicht mehr",
            sender="Jana Müller <jana@example.com>",
            body=GERMAN_BODY,
            html=GERMAN_HTML,
        ),
        **headers,
    )


def content(message) -> str:
    return message.get_content().replace("\r\n", "\n")  # the text part as the relay received it, CRLF lines


def token(event_id: int) -> str:
    return f"MR-{TicketMapping.objects.get(inbox_event_id=event_id, action='create_ticket').pk}"


def test_german_mail_gets_the_german_template_with_its_answer_by(mailbox, tenant, tenant_admin, smtp_server):
    save(tenant_admin, tenant, **ENGLISH)
    save(tenant_admin, tenant, language="fr", **FRENCH)
    save(tenant_admin, tenant, mailbox, language="de", **GERMAN)
    ack_services.save_business_hours(
        actor=tenant_admin,
        hours=BusinessHours(
            tenant=tenant,
            mailbox=mailbox,
            timezone="Europe/Berlin",
            weekly=OFFICE,
            holidays_country="DE",
            response_hours=8,
        ),
    )
    event_id = deliver(german_mail())
    assert acknowledge(event_id, planned_at=datetime(2026, 12, 4, 18, 0, tzinfo=BERLIN)) == "sent"  # a Friday night
    [ack] = smtp_server.messages
    number = token(event_id)
    assert ack["Subject"] == f"[#{number}] Ihre Anfrage {number}: Drucker druckt nicht mehr"
    assert ack["To"] == "jana@example.com"
    text = content(ack)
    assert text.startswith("Guten Tag Jana Müller,\n\nwir haben Ihre Anfrage erhalten und unter " + number)
    assert "Sie erhalten eine Antwort bis 2026-12-07 17:00 (Europe/Berlin)." in text  # Monday, end of day
    assert "Unsere Geschäftszeiten: Mon-Fri 09:00-17:00 (Europe/Berlin)" in text
    detail = AuditEvent.objects.get(inbox_event_id=event_id, kind="acknowledged").detail
    assert (detail["language"], detail["found_by"]) == ("de", "text")
    assert detail["template"] == AcknowledgmentTemplate.objects.get(language="de").pk


def test_content_language_wins_over_what_the_text_looks_like(mailbox, tenant, tenant_admin, smtp_server):
    save(tenant_admin, tenant, **ENGLISH)
    save(tenant_admin, tenant, language="de", **GERMAN)
    save(tenant_admin, tenant, language="fr", **FRENCH)
    event_id = deliver(german_mail(Content_Language="fr-CH"))
    assert acknowledge(event_id) == "sent"
    [ack] = smtp_server.messages
    assert ack["Subject"] == f"[#{token(event_id)}] Votre demande {token(event_id)}"
    assert content(ack).startswith("Bonjour,")
    detail = AuditEvent.objects.get(inbox_event_id=event_id, kind="acknowledged").detail
    assert (detail["language"], detail["found_by"]) == ("fr", "header")


def test_a_language_without_a_template_gets_the_mailbox_fallback_before_the_tenant_one(
    mailbox, tenant, tenant_admin, smtp_server
):
    save(tenant_admin, tenant, **ENGLISH)
    save(tenant_admin, tenant, mailbox, subject="Support desk: {{ subject }}", body="Thanks, {{ ticket_number }}.\n")
    save(tenant_admin, tenant, language="de", **GERMAN)
    event_id = deliver(
        with_headers(
            email_message(
                subject="Printer jammed",
                sender="jane@example.com",
                body="Hello, the printer on floor two has been jammed since this morning.\n",
            ),
            Content_Language="es",
        )
    )
    assert acknowledge(event_id) == "sent"
    assert smtp_server.messages[0]["Subject"] == f"[#{token(event_id)}] Support desk: Printer jammed"


def test_outside_business_hours_the_built_in_text_promises_the_next_opening(mailbox, tenant, smtp_server):
    BusinessHours.objects.create(
        tenant=tenant, timezone="Europe/Berlin", weekly=OFFICE, holidays_country="DE", response_hours=8
    )  # the tenant's hours, no template anywhere
    event_id = deliver(email_message(subject="Invoice question", sender="jane@example.com"))
    assert acknowledge(event_id, planned_at=datetime(2026, 12, 24, 16, 0, tzinfo=BERLIN)) == "sent"
    # One hour on Christmas Eve; the 25th and 26th are holidays, then the weekend: Monday 16:00.
    text = content(smtp_server.messages[0])
    assert "We will answer by 2026-12-28 16:00 (Europe/Berlin)." in text
    assert "within" not in text


def test_a_template_that_loops_over_the_body_is_refused_when_saved(mailbox, tenant, tenant_admin):
    refused = {
        "{% for line in body %}{{ line }}{% endfor %}": "loops ({% for %}) are not allowed",
        "{{ body }}": "unknown placeholder 'body'",
        "{{ subject.upper }}": "attribute access is not allowed",
        "{{ subject|truncatechars:10 }}": "the filter truncatechars is not allowed",
        "{{ subject|default:secret_key }}": "unknown placeholder 'secret_key'",
        "{% with a=subject %}{{ a }}{% endwith %}": "the tag {% with %} is not allowed",
        "{% include 'x.html' %}": "template syntax error",
        "{% if body %}x{% endif %}": "unknown placeholder 'body'",
        "{{ mailbox }}" * 70: "rendered more than 20000 characters (rendered with every placeholder at its longest)",
    }
    for body, message in refused.items():
        with pytest.raises(ValidationError) as caught:
            save(tenant_admin, tenant, mailbox, subject="Re: {{ subject }}", body=body)
        assert message.lower() in " ".join(caught.value.message_dict["body"]).lower(), body
    with pytest.raises(ValidationError) as caught:
        save(tenant_admin, tenant, subject="Hello\nBcc: x@example.net", body="Hi")
    assert caught.value.message_dict["subject"] == ["The subject is one line (no line breaks)."]
    assert not AcknowledgmentTemplate.objects.exists()


def test_a_looping_template_stored_past_the_check_is_bounded_when_sent(mailbox, tenant, smtp_server):
    # Written straight to the table (an import, an older release): only the render's limits stand.
    AcknowledgmentTemplate.objects.create(
        tenant=tenant, subject="Re: {{ subject }}", body="{% for letter in subject %}{{ subject }}{% endfor %}"
    )
    event_id = deliver(email_message(subject="Drucker " * 30, sender="jane@example.com"))
    assert acknowledge(event_id) == "template_failed"
    assert smtp_server.messages == []
    skipped = AuditEvent.objects.get(inbox_event_id=event_id, kind="acknowledgment_skipped").detail
    assert skipped["reason"] == "ack_template_failed"
    assert "rendered more than 20000 characters" in skipped["problem"]
    assert Intent.objects.get(inbox_event_id=event_id, action="notify_requester").state == "succeeded"
    assert InboxEvent.objects.get(pk=event_id).state == "completed"  # the ticket stands
    assert acknowledge(event_id) == "busy"  # done: never tried again


def test_a_template_that_runs_too_long_is_stopped_by_the_time_limit(mailbox, tenant, smtp_server, settings):
    settings.MAILROOM_REST_TEMPLATE_SECONDS = 0.2
    nested = (
        "{% for a in subject %}{% for b in subject %}{% for c in subject %}"
        "{% endfor %}{% endfor %}{% endfor %}"
    )  # 8 million steps, no output
    AcknowledgmentTemplate.objects.create(tenant=tenant, subject="Re: {{ subject }}", body=nested)
    event_id = deliver(email_message(subject="x" * 200, sender="jane@example.com"))
    assert acknowledge(event_id) == "template_failed"
    assert smtp_server.messages == []
    skipped = AuditEvent.objects.get(inbox_event_id=event_id, kind="acknowledgment_skipped").detail
    assert skipped == {
        "intent": skipped["intent"],
        "reason": "ack_template_failed",
        "problem": "the template took longer than 0.2 s to render",
    }


def test_no_header_can_be_injected_through_the_subject(mailbox, tenant, tenant_admin, smtp_server):
    save(tenant_admin, tenant, subject="{{ requester_name }} / {{ subject }}", body="Hi\n")
    event_id = deliver(email_message(subject="Help", sender="Jane <jane@example.com>"))
    InboxEvent.objects.filter(pk=event_id).update(subject="Help\r\nBcc: victim@example.net\r\n\r\nspam")
    assert acknowledge(event_id) == "sent"
    [ack] = smtp_server.messages
    assert ack["Bcc"] is None
    assert ack["Subject"] == f"[#{token(event_id)}] Jane / Help Bcc: victim@example.net spam"


def test_a_tenant_admin_cannot_touch_another_tenants_templates_or_mailboxes(mailbox, tenant, tenant_admin):
    other = make_tenant(slug="globex", name="Globex", domains=("globex.test",))
    theirs = make_mailbox(other, slug="globex-support", address="support@globex.test")
    with pytest.raises(PermissionDenied):
        save(tenant_admin, other, **ENGLISH)
    with pytest.raises(PermissionDenied, match="another tenant"):
        save(tenant_admin, tenant, theirs, **ENGLISH)
    with pytest.raises(PermissionDenied):
        ack_services.save_business_hours(actor=tenant_admin, hours=BusinessHours(tenant=other, weekly=OFFICE))
    assert not AcknowledgmentTemplate.objects.exists() and not BusinessHours.objects.exists()


def test_the_preview_renders_sample_values_and_the_next_answer(mailbox, tenant, tenant_admin):
    template = save(tenant_admin, tenant, mailbox, language="de", **GERMAN)
    save_hours = BusinessHours(tenant=tenant, timezone="Europe/Berlin", weekly=OFFICE, response_hours=8)
    ack_services.save_business_hours(actor=tenant_admin, hours=save_hours)
    shown = ack_services.preview(template=template, now=datetime(2026, 12, 4, 18, 0, tzinfo=BERLIN))
    assert shown["problem"] == ""
    assert shown["subject"] == "[#MR-1042] Ihre Anfrage MR-1042: Printer on fire"
    assert "Sie erhalten eine Antwort bis 2026-12-07 17:00 (Europe/Berlin)." in shown["body"]
    assert "support@acme.test" in shown["body"]


def test_acknowledgments_off_for_the_mailbox_still_sends_none_whatever_the_template(
    mailbox, tenant, tenant_admin, smtp_server
):
    save(tenant_admin, tenant, **ENGLISH)
    mailbox.settings = {**mailbox.settings, "acknowledge": False}
    mailbox.save()
    deliver(german_mail())
    assert not Intent.objects.filter(action="notify_requester").exists()
    assert ack_policy.ack_policy(mailbox) == ack_policy.ACK_NEVER


def test_the_admin_shows_only_the_tenants_templates_refuses_a_loop_and_previews_the_saved_one(client, mailbox, tenant):
    from tests.support.users import make_user

    other = make_tenant(slug="globex", name="Globex", domains=("globex.test",))
    AcknowledgmentTemplate.objects.create(tenant=other, subject="Globex says hi", body="Hi\n")
    admin = make_user("ada", groups=["mailroom-admin"], tenants=[tenant])
    client.force_login(admin)
    page = client.get("/admin/ticketing/acknowledgmenttemplate/")
    assert page.status_code == 200 and b"Globex says hi" not in page.content
    assert (
        client.get(
            f"/admin/ticketing/acknowledgmenttemplate/{AcknowledgmentTemplate.objects.get().pk}/change/"
        ).status_code
        == 404
    )
    form = {
        "tenant": tenant.pk,
        "mailbox": mailbox.pk,
        "language": "de",
        "subject": GERMAN["subject"],
        "body": "{% for line in body %}{{ line }}{% endfor %}",
    }
    refused = client.post("/admin/ticketing/acknowledgmenttemplate/add/", form)
    assert refused.status_code == 200 and "Loops ({% for %}) are not allowed" in refused.content.decode()
    saved = client.post("/admin/ticketing/acknowledgmenttemplate/add/", {**form, "body": GERMAN["body"]})
    assert saved.status_code == 302
    template = AcknowledgmentTemplate.objects.get(tenant=tenant)
    assert template.updated_by == "ada"
    change = client.get(f"/admin/ticketing/acknowledgmenttemplate/{template.pk}/change/").content.decode()
    assert "Subject: [#MR-1042] Ihre Anfrage MR-1042: Printer on fire" in change
    assert 'support@acme.test: <span class="ack-on">on (authenticated senders)</span>' in change
    theirs = make_mailbox(other, slug="globex-support", address="support@globex.test")
    foreign = client.post(
        "/admin/ticketing/acknowledgmenttemplate/add/",
        {**form, "mailbox": theirs.pk, "body": GERMAN["body"], "language": "fr"},
    )
    assert foreign.status_code == 200 and "Select a valid choice" in foreign.content.decode()
    assert AcknowledgmentTemplate.objects.filter(tenant=tenant).count() == 1


def test_business_hours_are_typed_one_day_a_line_and_checked_in_the_admin(client, mailbox, tenant):
    from tests.support.users import make_user

    client.force_login(make_user("ada", groups=["mailroom-admin"], tenants=[tenant]))
    form = {
        "tenant": tenant.pk,
        "mailbox": mailbox.pk,
        "timezone": "Europe/Berlin",
        "weekly": "mon 09:00-17:00\ntue 09:00-12:00, 13:00-17:00\nfri 09:00-14:00",
        "holidays_country": "DE",
        "holidays_subdivision": "BY",
        "response_hours": 8,
    }
    bad = client.post(
        "/admin/ticketing/businesshours/add/", {**form, "weekly": "mon 17:00-09:00", "holidays_subdivision": "ZZ"}
    ).content.decode()
    assert "must end after it starts" in bad and "is not a subdivision of DE" in bad
    assert client.post("/admin/ticketing/businesshours/add/", form).status_code == 302
    hours = BusinessHours.objects.get()
    assert hours.weekly == {
        "mon": [["09:00", "17:00"]],
        "tue": [["09:00", "12:00"], ["13:00", "17:00"]],
        "fri": [["09:00", "14:00"]],
    }
    assert hours.updated_by == "ada"
    page = client.get(f"/admin/ticketing/businesshours/{hours.pk}/change/").content.decode()
    assert "mon 09:00-17:00\ntue 09:00-12:00, 13:00-17:00\nfri 09:00-14:00" in page
    assert "answered by 20" in page


PIECES = st.sampled_from(
    [
        "Hello ",
        "\n\n",
        "Ticket ",
        "{{ requester_name }}",
        "{{ ticket_number }}",
        "{{ subject|upper }}",
        "{{ mailbox|title }}",
        "{{ business_hours|default:'any time' }}",
        "{% if answer_by %}by {{ answer_by }}{% endif %}",
        "{% if subject %}{{ subject }}{% else %}your request{% endif %}",
        "{{ requester_name|capfirst }}",
    ]
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(PIECES, max_size=400).map("".join), data=st.data())
def test_a_template_that_passes_the_save_check_renders_within_the_limits_for_any_values(body, data):
    errors = ack_templates.template_errors(subject="Re: {{ subject }}", body=body)
    if errors:  # only for what it could grow to: every piece is allowed
        assert list(errors) == ["body"] and "rendered more than 20000 characters" in errors["body"]
        return
    values = {
        name: data.draw(st.text(max_size=size), label=name) for name, size in ack_templates.VALUE_MAX_CHARS.items()
    }
    subject, rendered = ack_templates.render(subject="Re: {{ subject }}", body=body, values=values)
    assert "\n" not in subject and "\r" not in subject
    assert len(rendered) <= settings_module.MAILROOM_ACK_TEMPLATE_MAX_CHARS


def test_the_language_is_read_from_content_language_first_then_from_the_text():
    from ticketing import ack_language

    assert ack_language.from_header("de-AT, en") == "de"
    assert ack_language.from_header("x-klingon, FR") == "fr"
    assert ack_language.from_header("") == ""
    languages = frozenset({"de", "fr"})
    assert ack_language.language_of(header="fr", text=GERMAN_BODY, languages=languages) == ("fr", "header")
    assert ack_language.language_of(header="", text=GERMAN_BODY, languages=languages) == ("de", "text")
    assert ack_language.language_of(
        header="", text="Bonjour, mon imprimante ne marche plus depuis hier.", languages=languages
    ) == ("fr", "text")
    # Only English (or any-language) templates: nothing to tell apart, the detector is not asked.
    assert ack_language.language_of(header="", text=GERMAN_BODY, languages=frozenset()) == ("", "")
    assert ack_language.is_known("de") and not ack_language.is_known("xx") and not ack_language.is_known("deu")


def test_an_unauthenticated_senders_display_name_is_not_echoed_by_a_template(
    mailbox, tenant, tenant_admin, smtp_server, settings
):
    # ack_policy "always" (allowed by the platform) acknowledges a sender nobody authenticated: their From's
    # display name is words a stranger chose, like the subject, and must not go out from the tenant's address.
    settings.MAILROOM_ACK_ALLOW_UNAUTHENTICATED = True
    mailbox.settings = {**mailbox.settings, "ack_policy": "always"}
    mailbox.save(update_fields=["settings"])
    save(
        tenant_admin,
        tenant,
        subject="For {{ requester_name|default:'you' }}",
        body="Hello {{ requester_name|default:'there' }},\n\nthis is {{ ticket_number }}.\n",
    )
    raw = email_message(subject="Refund", sender="Claim your refund at evil.example <jane@example.com>")
    response = Client().post(
        "/webhooks/raw/support/", data=raw, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, raw)
    )
    event_id = response.json()["inbox_event_id"]
    assert process_inbox_event(event_id) == "created"

    assert acknowledge(event_id) == "sent"

    [ack] = smtp_server.messages
    assert "evil.example" not in ack["Subject"] and ack["Subject"].endswith("For you")
    assert ack.get_payload().startswith("Hello there,")
