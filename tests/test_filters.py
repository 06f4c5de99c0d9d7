"""Filters: header and risk-signal conditions, and the suppress, tag and mark_spam actions, through the real
pipeline (ingest -> normalize -> classify -> the built-in store), a replay of a rule-suppressed event, the
dry run of a header rule, and the rule form and API checks."""

import pytest
from django.contrib.auth import get_user_model

from intake.models import AuditEvent, InboxEvent
from intake.vocabulary import AuditKind, ReasonCode
from tests.clamd import clamd  # noqa: F401  (the session's real clamd)
from tests.factories import email_message, make_event
from tests.senderauth import stamped, trust_our_mta
from ticketing.classification import Route
from ticketing.classification.conditions import first_number, matches, validate_conditions
from ticketing.classification.facts import MAX_HEADER_VALUE_CHARS, MAX_HEADERS, MessageFacts, header_fields
from ticketing.dry_run import dry_run
from ticketing.models import Intent, RoutingRule, Ticket
from ticketing.replay import replay_same_key
from ticketing.routing_admin import RoutingRuleForm, describe_conditions
from ticketing.services import process_inbox_event

RAW = (
    b"Received: from mx.example.com by mx.acme.test; Tue, 1 Dec 2026 09:00:00 +0000\r\n"
    b"From: Jane <jane@example.com>\r\nTo: support@acme.test\r\nSubject: Hello\r\n"
    b"Date: Tue, 1 Dec 2026 09:00:00 +0000\r\nMessage-ID: <a1@example.com>\r\nMIME-Version: 1.0\r\n"
    b"X-Spam-Score: 12.3 (hits)\r\nX-Spam-Score: 1.0\r\n"
    b"List-Id: Weekly news\r\n <news.example.com>\r\nX-Mailer: =?utf-8?q?Mail=C3=A9r_9?=\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n\r\nX-Body-Header: not a header\r\n"
)
FACTS = MessageFacts(
    headers=header_fields(RAW), spam_score=12.3, attachment_verdict="clean", auth={"dmarc": "fail", "spf": "pass"}
)


# --- conditions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tests, expected",
    [
        ([{"name": "x-spam-score", "op": "exists"}], True),  # names are case-insensitive
        ([{"name": "X-Virus", "op": "exists"}], False),
        ([{"name": "X-Virus", "op": "exists", "value": False}], True),  # absent
        ([{"name": "X-Body-Header", "op": "exists"}], False),  # the body is not the header block
        ([{"name": "X-Spam-Score", "op": "gt", "value": 8}], True),  # "12.3 (hits)": any instance may hold
        ([{"name": "X-Spam-Score", "op": "lt", "value": 2}], True),  # the second instance, 1.0
        ([{"name": "X-Spam-Score", "op": "ge", "value": 12.4}], False),
        ([{"name": "X-Spam-Score", "op": "le", "value": 0.5}], False),
        ([{"name": "List-Id", "op": "regex", "value": r"<news\.example\.com>"}], True),  # unfolded
        ([{"name": "List-Id", "op": "equals", "value": "weekly news <news.example.com>"}], True),
        ([{"name": "List-Id", "op": "equals", "value": "weekly news"}], False),  # the whole value
        ([{"name": "X-Mailer", "op": "equals", "value": "Mailér 9"}], True),  # encoded word decoded
        ([{"name": "X-Mailer", "op": "gt", "value": 5}], True),
        ([{"name": "Subject", "op": "gt", "value": 0}], False),  # no number: no match
        ([{"name": "X-Spam-Score", "op": "gt", "value": 8}, {"name": "X-Virus", "op": "exists"}], False),  # all
    ],
)
def test_each_header_test(tests, expected):
    assert validate_conditions({"header": tests}) == []
    assert matches({"header": tests}, FACTS) is expected


@pytest.mark.parametrize(
    "conditions, expected",
    [
        ({"spam_score": {"op": "gt", "value": 8}}, True),
        ({"spam_score": {"op": "lt", "value": 8}}, False),
        ({"attachment_verdict": "clean"}, True),
        ({"attachment_verdict": ["infected", "unscanned"]}, False),
        ({"auth": {"dmarc": "fail"}}, True),
        ({"auth": {"dkim": "none"}}, True),  # not in the trusted results: none
        ({"auth": {"spf": "none"}}, False),
        ({"spam_flagged": False}, True),
    ],
)
def test_each_risk_signal_condition(conditions, expected):
    assert validate_conditions(conditions) == []
    assert matches(conditions, FACTS) is expected


def test_a_message_without_a_spam_score_never_matches_a_score_condition():
    assert not matches({"spam_score": {"op": "lt", "value": 100}}, MessageFacts())


def test_the_first_number_of_a_value_is_what_numeric_tests_compare():
    assert first_number("12.3 (hits)") == 12.3
    assert first_number("Yes, score=-2.5") == -2.5
    assert first_number("no number") is None


def test_header_fields_are_bounded_in_count_and_size():
    many = b"".join(b"X-H%d: value\r\n" % n for n in range(MAX_HEADERS + 50)) + b"\r\nbody"
    assert len(header_fields(many)) == MAX_HEADERS
    [(name, value)] = header_fields(b"X-Long: " + b"v" * 5000 + b"\r\n\r\nbody")
    assert (name, len(value)) == ("x-long", MAX_HEADER_VALUE_CHARS)
    # Only the first MAX_HEADER_BLOCK_BYTES are read: a header block of megabytes costs no more.
    huge = b"".join(b"X-H%d: %s\r\n" % (n, b"v" * 1000) for n in range(1000)) + b"X-Late: 1\r\n\r\n"
    assert len(header_fields(huge)) < 70 and ("x-late", "1") not in header_fields(huge)
    # A value folded over thousands of one-character lines keeps what a value may hold, and the fields after it.
    folded = b"X-Folded: 1\r\n" + b" a\r\n" * 5000 + b"X-Spam-Score: 12\r\n\r\nbody"
    fields = dict(header_fields(folded))
    assert len(fields["x-folded"]) == MAX_HEADER_VALUE_CHARS and fields["x-spam-score"] == "12"
    assert dict(header_fields(b"Subject: a\r\n b\r\n\tc\r\n\r\n")) == {"subject": "a b c"}


def test_invalid_header_and_risk_conditions_have_clear_messages():
    errors = validate_conditions(
        {
            "header": [
                {"name": "X Spam", "op": "gt", "value": "eight"},
                {"name": "List-Id", "op": "regex", "value": "(unclosed"},
                {"name": "X-A", "op": "like", "value": "x"},
            ],
            "spam_score": {"op": "over", "value": 8},
            "attachment_verdict": "dirty",
        }
    )
    text = "\n".join(errors)
    assert "header test 1: name must be a header name (X-Spam-Score), not 'X Spam'" in text
    assert "header test 1: gt compares with a number, not 'eight'" in text
    assert "header test 2: invalid regular expression" in text
    assert "header test 3: op must be one of exists, equals, regex, gt, ge, lt, le, not 'like'" in text
    assert 'spam_score: expected {"op": "gt" | "ge" | "lt" | "le", "value": a number}' in text
    assert "attachment_verdict: expected one of none, clean, infected, unscanned, unknown" in text
    assert validate_conditions({"header": []}) == [
        'header: expected a test such as {"name": "X-Spam-Score", "op": "gt", "value": 8}, or a list of them'
    ]


def test_the_console_reads_header_and_risk_conditions_as_sentences():
    text = describe_conditions(
        {
            "header": [{"name": "X-Spam-Score", "op": "gt", "value": 8}, {"name": "List-Id", "op": "exists"}],
            "spam_score": {"op": "ge", "value": 5},
            "attachment_verdict": "unscanned",
        }
    )
    assert text == (
        "header X-Spam-Score > 8 AND header List-Id exists AND spam score ≥ 5 AND attachments are unscanned"
    )


# --- through the pipeline -------------------------------------------------------------------------------


def rule(tenant, position, conditions, **fields) -> RoutingRule:
    return RoutingRule.objects.create(
        tenant=tenant, position=position, name=f"rule {position}", conditions=conditions, **fields
    )


def run(mailbox, raw: bytes | None = None, **message) -> InboxEvent:
    event = make_event(mailbox, raw, **message) if raw is not None else make_event(mailbox, **message)
    process_inbox_event(event.pk)
    return InboxEvent.objects.get(pk=event.pk)


def ticket_of(event) -> Ticket:
    return Ticket.objects.get(idempotency_key=event.intents.get(action="create_ticket").idempotency_key)


def acknowledgment_skips(event) -> list[str]:
    return [
        a.detail["reason"] for a in AuditEvent.objects.filter(inbox_event=event, kind=AuditKind.ACKNOWLEDGMENT_SKIPPED)
    ]


def test_a_header_rule_routes_list_mail_and_others_are_left_alone(mailbox, scanner_off):
    rule(
        mailbox.tenant,
        10,
        {"header": [{"name": "List-Id", "op": "regex", "value": r"news\.example\.com"}]},
        queue="newsletters",
    )
    listed = run(mailbox, extra_headers={"List-Id": "Weekly <news.example.com>"}, subject="Our news")
    plain = run(mailbox, subject="Printer on fire")

    assert ticket_of(listed).queue == "newsletters"
    assert ticket_of(plain).queue == ""


def test_a_tag_rule_adds_its_tags_and_the_next_rule_still_routes(mailbox, scanner_off):
    tagging = rule(
        mailbox.tenant,
        10,
        {"spam_score": {"op": "ge", "value": 3}},
        action="tag",
        tags=["suspicious", "score-3"],
        stop_processing=True,
    )  # a tag rule never stops the rules
    routing = rule(mailbox.tenant, 20, {"keywords": ["invoice"]}, queue="billing")

    event = run(mailbox, subject="Your invoice", extra_headers={"X-Spam-Score": "3.5"})

    ticket = ticket_of(event)
    assert ticket.tags == ["mailroom", "suspicious", "score-3"]
    assert ticket.queue == "billing"
    assert Route.from_json(event.route).rules == [tagging.pk, routing.pk]
    assert ticket_of(run(mailbox, subject="Your invoice")).tags == ["mailroom"]  # no score: no tag


def test_an_auth_rule_tags_mail_whose_dmarc_failed_at_our_own_mta(mailbox, scanner_off):
    trust_our_mta(mailbox)
    rule(mailbox.tenant, 10, {"auth": {"dmarc": "fail"}}, action="tag", tags=["dmarc-fail"])
    failed = run(mailbox, stamped(email_message(subject="Pay now"), dmarc="fail"))
    passed = run(mailbox, stamped(email_message(subject="Hello")))

    assert ticket_of(failed).tags == ["mailroom", "dmarc-fail"]
    assert ticket_of(passed).tags == ["mailroom"]


def test_attachment_verdict_rules_see_what_the_scanner_said(mailbox, settings, clamd):  # noqa: F811
    settings.MAILROOM_CLAMD = clamd.tcp_address
    rule(mailbox.tenant, 10, {"attachment_verdict": "clean"}, action="tag", tags=["scanned"])
    rule(mailbox.tenant, 20, {"attachment_verdict": "unscanned"}, action="tag", tags=["not-scanned"])
    pdf = [("report.pdf", "application/pdf", b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n")]

    scanned = run(mailbox, subject="The report", attachments=pdf)
    assert scanned.details["attachment_scan"] == "clean"
    assert ticket_of(scanned).tags == ["mailroom", "scanned"]

    settings.MAILROOM_CLAMD = "off"
    unscanned = run(mailbox, subject="The report again", attachments=pdf)
    assert unscanned.details["attachment_scan"] == "unscanned"
    assert ticket_of(unscanned).tags == ["mailroom", "not-scanned"]
    assert run(mailbox, subject="No files").details["attachment_scan"] == "none"


def test_a_suppress_rule_suppresses_with_its_reason_and_a_replay_makes_the_ticket(mailbox, scanner_off):
    suppress = rule(
        mailbox.tenant,
        10,
        {"header": [{"name": "X-Mailer", "op": "regex", "value": "^BulkBlaster"}]},
        action="suppress",
        suppress_reason="bulk mailer, not a customer",
    )

    event = run(mailbox, extra_headers={"X-Mailer": "BulkBlaster 3000"}, subject="Deals!")

    assert event.state == InboxEvent.State.SUPPRESSED
    assert event.reason_code == ReasonCode.RULE_SUPPRESSED
    assert event.reason_detail == f"suppressed by rule {suppress.pk} “rule 10”: bulk mailer, not a customer"
    assert not Intent.objects.filter(inbox_event=event).exists()
    [audit] = AuditEvent.objects.filter(inbox_event=event, kind=AuditKind.SUPPRESSED)
    assert audit.detail == {
        "state": "suppressed",
        "reason": "rule_suppressed",
        "rule": suppress.pk,
        "rule_name": "rule 10",
        "suppress_reason": "bulk mailer, not a customer",
    }
    suppress.refresh_from_db()
    assert suppress.hits == 1

    # The operator says it is a request after all: the replay sends it on, and the rule does not win again.
    assert replay_same_key(event.pk, actor="user:olga", route={"queue": "sales"}) == "rerouted"
    assert process_inbox_event(event.pk) == "created"
    event.refresh_from_db()
    assert event.state == InboxEvent.State.COMPLETED
    assert ticket_of(event).queue == "sales"
    assert AuditEvent.objects.filter(inbox_event=event, kind=AuditKind.REPLAYED, actor="user:olga").exists()
    suppress.refresh_from_db()
    assert suppress.hits == 1  # classified once: the stored route is reused


def test_mark_spam_makes_the_ticket_in_the_spam_queue_without_an_acknowledgment(mailbox, scanner_off):
    trust_our_mta(mailbox)
    policy = mailbox.tenant.routing_policy
    policy.queues = ["support"]
    policy.save()
    spam = rule(
        mailbox.tenant,
        10,
        {"header": [{"name": "X-Spam-Score", "op": "gt", "value": 8}]},
        action="mark_spam",
        tags=["wave-1"],
    )
    # X-Spam-Score 2 is under the mailbox's spam threshold: only the rule decides it is spam.
    rule(mailbox.tenant, 5, {"header": [{"name": "X-Campaign", "op": "exists"}]}, action="mark_spam")

    flagged = run(mailbox, stamped(email_message(subject="Cheap pills", extra_headers={"X-Spam-Score": "12"})))
    campaign = run(
        mailbox, stamped(email_message(subject="Offer", extra_headers={"X-Campaign": "a", "X-Spam-Score": "2"}))
    )
    person = run(mailbox, stamped(email_message(subject="Printer on fire")))

    ticket = ticket_of(flagged)
    assert (ticket.queue, ticket.tags) == ("spam", ["mailroom", "spam", "wave-1"])
    route = Route.from_json(flagged.route)
    assert route.action == "mark_spam" and route.fields["queue"].flag == ""  # the spam queue is always known
    assert route.rules == [spam.pk]
    assert ticket_of(campaign).queue == "spam"
    assert acknowledgment_skips(campaign) == [ReasonCode.MARKED_SPAM]
    assert acknowledgment_skips(flagged) == [ReasonCode.MARKED_SPAM]
    assert not Intent.objects.filter(inbox_event__in=[flagged, campaign], action="notify_requester").exists()
    # The control: a person's mail through the same mailbox is acknowledged.
    assert Intent.objects.filter(inbox_event=person, action="notify_requester").count() == 1


# --- the dry run ------------------------------------------------------------------------------------------


def test_the_dry_run_of_a_header_rule_finds_the_stored_mail_and_says_what_the_action_would_do(mailbox, scanner_off):
    spammy = run(mailbox, subject="Deals", extra_headers={"X-Spam-Score": "12.0 / 15"})
    run(mailbox, subject="Printer on fire", extra_headers={"X-Spam-Score": "0.4"})
    run(mailbox, subject="No score at all")
    draft = RoutingRule(
        tenant=mailbox.tenant,
        name="spam wave",
        position=1,
        enabled=False,
        action="mark_spam",
        conditions={"header": [{"name": "X-Spam-Score", "op": "gt", "value": 8}]},
    )
    draft.save()

    result = dry_run(draft, days=7)

    assert [m.event.pk for m in result.matches] == [spammy.pk]
    changes = {c.field: (c.current, c.new) for c in result.matches[0].changes}
    assert changes == {
        "queue": ("", "spam"),
        "tags": ("—", "+ spam"),
        "acknowledgment": ("as usual", "none (marked as spam)"),
    }
    assert Ticket.objects.filter(queue="spam").count() == 0  # nothing was written

    risk = RoutingRule.objects.create(
        tenant=mailbox.tenant,
        name="risky",
        position=2,
        enabled=False,
        action="suppress",
        suppress_reason="scored",
        conditions={"spam_score": {"op": "gt", "value": 8}},
    )
    [match] = dry_run(risk, days=7).matches
    assert match.event.pk == spammy.pk
    assert [(c.field, c.new) for c in match.changes] == [("outcome", "suppressed: scored (replayable)")]


# --- the rule form ------------------------------------------------------------------------------------------


def form_errors(tenant, **fields) -> dict:
    data = {
        "tenant": tenant.pk,
        "name": "r",
        "position": 1,
        "enabled": True,
        "conditions": "{}",
        "stop_processing": True,
        "action": "route",
        **fields,
    }
    form = RoutingRuleForm(data=data)
    form.is_valid()
    return {name: " ".join(messages) for name, messages in form.errors.items()}


def test_the_rule_form_checks_each_action(tenant):
    assert form_errors(tenant, action="tag") == {"tags": "A tag rule needs at least one tag."}
    assert "needs the reason" in form_errors(tenant, action="suppress")["suppress_reason"]
    assert form_errors(tenant, action="suppress", suppress_reason="noise", assignee="maria") == {
        "assignee": "A suppress rule sets no assignee: it would be ignored."
    }
    assert form_errors(tenant, tags="x") == {"tags": "Tags are added by the tag and mark_spam actions only."}
    assert "Not a tag" in form_errors(tenant, action="tag", tags="ok, not ok!")["tags"]
    assert form_errors(tenant, action="mark_spam", tags="bulk") == {}
    assert (
        form_errors(
            tenant,
            action="tag",
            tags="vip, vip,  key-account",
            conditions='{"header": [{"name": "X-Priority", "op": "le", "value": 2}]}',
        )
        == {}
    )


def test_the_api_checks_each_action_and_stores_the_tags(tenant):
    from rest_framework.test import APIClient

    user = get_user_model().objects.create_superuser("root", "root@staff.test", "pw-root-root")
    client = APIClient()
    client.force_authenticate(user)
    bad = client.post("/api/v1/routing-rules/", {"tenant": tenant.slug, "name": "t", "action": "tag"}, format="json")
    assert bad.status_code == 400 and "A tag rule needs at least one tag." in bad.content.decode()
    good = client.post(
        "/api/v1/routing-rules/",
        {
            "tenant": tenant.slug,
            "name": "t",
            "action": "tag",
            "tags": ["vip", "vip", "key"],
            "conditions": {"header": [{"name": "X-Priority", "op": "le", "value": 2}]},
        },
        format="json",
    )
    assert good.status_code == 201, good.content
    assert good.json()["tags"] == ["vip", "key"] and good.json()["action"] == "tag"
    # A PATCH is checked against what the rule already is.
    patched = client.patch(f"/api/v1/routing-rules/{good.json()['id']}/", {"tags": []}, format="json")
    assert patched.status_code == 400


def test_in_the_workers_groups_each_action_does_what_it_does_one_event_at_a_time(mailbox, scanner_off):
    from ticketing import tasks

    rule(
        mailbox.tenant,
        10,
        {"header": [{"name": "X-Mailer", "op": "equals", "value": "BulkBlaster"}]},
        action="suppress",
        suppress_reason="bulk mailer",
    )
    rule(
        mailbox.tenant, 20, {"header": [{"name": "X-Priority", "op": "le", "value": 2}]}, action="tag", tags=["urgent"]
    )
    rule(mailbox.tenant, 30, {"spam_score": {"op": "gt", "value": 8}}, action="mark_spam")
    ids = [
        make_event(mailbox, subject="Deals", extra_headers={"X-Mailer": "bulkblaster"}).pk,
        make_event(mailbox, subject="Down!", extra_headers={"X-Priority": "1 (Highest)"}).pk,
        make_event(mailbox, subject="Pills", extra_headers={"X-Spam-Score": "12"}).pk,
        make_event(mailbox, subject="Printer on fire").pk,
    ]

    assert tasks.process_inbox_events(ids) == {"created": 3, "suppressed": 1}

    suppressed, urgent, spam, plain = (InboxEvent.objects.get(pk=pk) for pk in ids)
    assert (suppressed.state, suppressed.reason_code) == ("suppressed", ReasonCode.RULE_SUPPRESSED)
    assert ticket_of(urgent).tags == ["mailroom", "urgent"]
    assert (ticket_of(spam).queue, ticket_of(spam).tags) == ("spam", ["mailroom", "spam"])
    assert acknowledgment_skips(spam) == [ReasonCode.MARKED_SPAM]
    assert (ticket_of(plain).queue, ticket_of(plain).tags) == ("", ["mailroom"])


def test_a_rule_written_with_symbols_and_a_single_header_test_is_stored_in_our_words(tenant):
    from rest_framework.test import APIClient

    user = get_user_model().objects.create_superuser("root", "root@staff.test", "pw-root-root")
    client = APIClient()
    client.force_authenticate(user)
    created = client.post(
        "/api/v1/routing-rules/",
        {
            "tenant": tenant.slug,
            "name": "spam wave",
            "action": "mark_spam",
            "conditions": {
                "header": {"name": "X-Spam-Score", "op": ">", "value": 8},
                "spam_score": {"op": ">=", "value": 5},
            },
        },
        format="json",
    )

    assert created.status_code == 201, created.content
    rule = RoutingRule.objects.get(pk=created.json()["id"])
    assert rule.conditions == {
        "header": [{"name": "X-Spam-Score", "op": "gt", "value": 8}],
        "spam_score": {"op": "ge", "value": 5},
    }
    spam = MessageFacts(headers=(("x-spam-score", "12.0"),), spam_score=12.0)
    assert matches(rule.conditions, spam) and not matches(rule.conditions, MessageFacts(spam_score=12.0))
    refused = client.post(
        "/api/v1/routing-rules/",
        {"tenant": tenant.slug, "name": "x", "conditions": {"header": {"name": "X-Spam-Score", "op": "~", "value": 8}}},
        format="json",
    )
    assert refused.status_code == 400 and "op must be one of" in refused.content.decode()
