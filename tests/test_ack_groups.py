"""A group of acknowledgments (the relay publishes them in groups) goes out over one SMTP connection, each
message once: claimed in one statement, recorded in one transaction, and what goes wrong for one message
(a template, an address, a dropped connection) stays that message's own. A real SMTP server (aiosmtpd)
that can drop the connection, real PostgreSQL."""

import email
from datetime import timedelta
from email import policy

import pytest
from django.test import Client
from django.utils import timezone

from intake.models import AuditEvent
from tests.conftest import WEBHOOK_SECRET
from tests.mail import make_message, webhook_headers
from tests.senderauth import stamped, trust_our_mta
from tests.smtp import serving
from tests.support.eai import JOSE, eai_request
from ticketing import acknowledgments, intents
from ticketing.models import AcknowledgmentTemplate, Intent
from ticketing.services import process_inbox_event
from ticketing.tasks import send_acknowledgments


class Relay:
    """Keeps each message with the connection it came on (the client's address and port). `drop_at`: the
    number of the message (1-based, counted over the server's life) on which it closes the connection
    instead of answering, once; `keep_dropped`: whether it had taken that message first (accepted, but the
    answer never reached the client)."""

    def __init__(self, drop_at: int | None = None, keep_dropped: bool = False):
        self.messages, self.peers = [], []
        self.drop_at, self.keep_dropped, self.seen = drop_at, keep_dropped, 0

    async def handle_DATA(self, server, session, envelope):
        self.seen += 1
        if self.seen == self.drop_at:
            if self.keep_dropped:
                self.keep(session, envelope)
            server.transport.close()
            return "421 closing"
        self.keep(session, envelope)
        return "250 OK"

    def keep(self, session, envelope):
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        self.peers.append(session.peer)


@pytest.fixture(autouse=True)
def _our_mta_is_trusted(mailbox, settings):
    settings.MAILROOM_CLAMD = "off"
    trust_our_mta(mailbox)


def post(body: bytes) -> int:
    response = Client().post(
        "/webhooks/raw/support/", data=body, content_type="message/rfc822", **webhook_headers(WEBHOOK_SECRET, body)
    )
    assert response.status_code == 202
    event_id = response.json()["inbox_event_id"]
    assert process_inbox_event(event_id) == "created"
    return event_id


def planned(count: int) -> list[int]:
    """`count` requests from authenticated senders made into tickets: their acknowledgment intents, planned."""
    events = [post(stamped(make_message(subject=f"Request {n}", sender=f"user{n}@example.com"))) for n in range(count)]
    return [Intent.objects.get(inbox_event_id=event_id, action="notify_requester").pk for event_id in events]


def state(intent_id: int) -> str:
    return Intent.objects.get(pk=intent_id).state


def acknowledged_rows(intent_ids) -> dict[int, int]:
    rows = AuditEvent.objects.filter(kind="acknowledged").values_list("detail", flat=True)
    counts = {intent_id: 0 for intent_id in intent_ids}
    for detail in rows:
        counts[detail["intent"]] = counts.get(detail["intent"], 0) + 1
    return counts


def make_due(intent_ids) -> None:
    """Later: the retries' backoff has passed."""
    Intent.objects.filter(pk__in=intent_ids).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def make_not_due(intent_ids) -> None:
    """Sooner: the retries' backoff has not passed. (Full jitter draws it from [0, base): left to the draw, one
    of three could be due within a few milliseconds, and was once on a busy machine.)"""
    Intent.objects.filter(pk__in=intent_ids, state="retry_wait").update(
        next_attempt_at=timezone.now() + timedelta(minutes=5)
    )


def test_a_group_goes_out_over_one_connection_each_intent_succeeded_once(mailbox, settings):
    ids = planned(6)
    with serving(settings, Relay()) as relay:
        assert send_acknowledgments(ids) == {"sent": 6}
        assert len(relay.messages) == 6 and len(set(relay.peers)) == 1  # one SMTP connection for the group
        assert sorted(m["To"] for m in relay.messages) == sorted(f"user{n}@example.com" for n in range(6))
        assert all(state(pk) == "succeeded" for pk in ids)
        assert acknowledged_rows(ids) == {pk: 1 for pk in ids}
        # Each intent's result is the Message-ID its email carried; its audit row names its ticket.
        by_id = {m["Message-ID"]: m for m in relay.messages}
        for intent in Intent.objects.filter(pk__in=ids):
            assert intent.result_ref == acknowledgments.message_id(intent) and intent.result_ref in by_id
            row = AuditEvent.objects.get(kind="acknowledged", inbox_event_id=intent.inbox_event_id)
            assert by_id[intent.result_ref]["Subject"].startswith(f"[#{row.detail['token']}] ")
            assert row.detail["template"] == "builtin" and row.actor.startswith("worker:")

        assert send_acknowledgments(ids) == {"busy": 6}  # replayed: nothing more
        assert send_acknowledgments([ids[0], ids[0]]) == {"busy": 2}
        assert len(relay.messages) == 6 and acknowledged_rows(ids) == {pk: 1 for pk in ids}


def test_a_template_failure_and_an_undeliverable_address_stay_their_own(mailbox, tenant, settings):
    # A German template that loops (stored past the save check): only the German request's render fails.
    AcknowledgmentTemplate.objects.create(
        tenant=tenant,
        language="de",
        subject="Re: {{ subject }}",
        body="{% for letter in subject %}{{ subject }}{% endfor %}",
    )
    ids = planned(2)
    # Content-Language where Outlook writes it, among the top-level headers (`set_content` drops it).
    german = post(stamped(b"Content-Language: de\n" + make_message(subject="Drucker " * 30, sender="jana@example.com")))
    jose = post(eai_request(JOSE))  # a non-ASCII local part, and this relay offers no SMTPUTF8
    german_intent, jose_intent = (
        Intent.objects.get(inbox_event_id=e, action="notify_requester").pk for e in (german, jose)
    )
    with serving(settings, Relay()) as relay:
        outcome = acknowledgments.send_group([german_intent, ids[0], jose_intent, ids[1]], worker="worker-a")
    assert outcome == {"template_failed": 1, "sent": 2, "not_deliverable": 1}
    assert sorted(m["To"] for m in relay.messages) == ["user0@example.com", "user1@example.com"]
    skipped = {
        row.inbox_event_id: row.detail["reason"] for row in AuditEvent.objects.filter(kind="acknowledgment_skipped")
    }
    assert skipped == {german: "ack_template_failed", jose: "address_not_deliverable"}
    results = dict(Intent.objects.filter(pk__in=[german_intent, jose_intent]).values_list("pk", "result_ref"))
    assert results == {german_intent: "not-sent:ack_template_failed", jose_intent: "not-sent:address_not_deliverable"}
    assert acknowledged_rows(ids) == {ids[0]: 1, ids[1]: 1}


def test_a_connection_dropped_after_k_messages_sends_k_and_the_rest_later_each_once(mailbox, settings):
    ids = planned(5)
    started = timezone.now()
    with serving(settings, Relay(drop_at=3)) as relay:  # two taken, the third's connection closed unanswered
        assert acknowledgments.send_group(ids, worker="worker-a") == {"sent": 2, "retry_wait": 3}
        assert [state(pk) for pk in ids] == ["succeeded"] * 2 + ["retry_wait"] * 3
        assert len(relay.messages) == 2
        failed = Intent.objects.get(pk=ids[2])
        assert failed.last_error_kind == "transient:smtp_unavailable"
        assert Intent.objects.get(pk=ids[3]).last_error.startswith("smtp_unavailable: not attempted")
        assert all(Intent.objects.get(pk=pk).next_attempt_at >= started for pk in ids[2:])  # each backed off
        make_not_due(ids)
        assert acknowledgments.send_group(ids, worker="worker-a") == {"busy": 5}  # not due yet: nothing sent

        make_due(ids)
        assert acknowledgments.send_group(ids, worker="worker-b") == {"busy": 2, "sent": 3}
    assert sorted(m["To"] for m in relay.messages) == sorted(f"user{n}@example.com" for n in range(5))
    assert len(set(relay.peers)) == 2  # the first connection, then the retry's
    assert all(state(pk) == "succeeded" for pk in ids)
    assert acknowledged_rows(ids) == {pk: 1 for pk in ids}


def test_a_message_accepted_whose_answer_was_lost_is_sent_again_as_the_same_message(mailbox, settings):
    ids = planned(3)
    with serving(settings, Relay(drop_at=2, keep_dropped=True)) as relay:
        assert acknowledgments.send_group(ids, worker="worker-a") == {"sent": 1, "retry_wait": 2}
        make_due(ids)
        assert acknowledgments.send_group(ids, worker="worker-a") == {"busy": 1, "sent": 2}
    # The second message reached the server twice, under one Message-ID: the recipient's mail system sees
    # a resend of the same message. Nothing else went twice.
    message_ids = [m["Message-ID"] for m in relay.messages]
    assert len(message_ids) == 4 and len(set(message_ids)) == 3
    assert message_ids.count(Intent.objects.get(pk=ids[1]).result_ref) == 2
    assert acknowledged_rows(ids) == {pk: 1 for pk in ids}


def test_an_intent_another_worker_holds_is_left_to_it(mailbox, settings):
    ids = planned(3)
    assert intents.claim(ids[1], worker="worker-b")
    with serving(settings, Relay()) as relay:
        assert acknowledgments.send_group(ids, worker="worker-a") == {"sent": 2, "busy": 1}
    assert sorted(m["To"] for m in relay.messages) == ["user0@example.com", "user2@example.com"]
    held = Intent.objects.get(pk=ids[1])
    assert (held.state, held.claimed_by) == ("in_flight", "worker-b")
    assert acknowledged_rows(ids) == {ids[0]: 1, ids[1]: 0, ids[2]: 1}


def test_a_group_stops_before_its_claim_runs_out(mailbox, settings):
    ids = planned(2)
    settings.MAILROOM_CLAIM_SECONDS = 0  # the claim is up as soon as it is taken: nothing may start
    with serving(settings, Relay()) as relay:
        assert acknowledgments.send_group(ids, worker="worker-a") == {"retry_wait": 2}
    assert relay.messages == []
    assert "the group's claim is nearly up" in Intent.objects.get(pk=ids[0]).last_error


def test_one_acknowledgment_alone_takes_the_same_path(mailbox, settings):
    [intent_id] = planned(1)
    with serving(settings, Relay()) as relay:
        assert acknowledgments.send(intent_id, "worker-a") == "sent"
        assert acknowledgments.send(intent_id, "worker-a") == "busy"
    assert len(relay.messages) == 1 and acknowledged_rows([intent_id]) == {intent_id: 1}
    assert acknowledgments.send(10**9, "worker-a") == "missing"
