"""Threads: a reply becomes one comment on its ticket, in arrival order, under the thread's lease."""

import subprocess
import threading
import time

import pytest
from django.db import connection

from intake.models import InboxEvent
from tests.factories import email_message, ingest_message
from tests.live import PYTHON, REPO_ROOT, live_mailbox, subprocess_env, wait_for  # noqa: F401 (fixture)
from ticketing.models import Intent, ThreadLease, Ticket, TicketComment, TicketMapping
from ticketing.outcomes import Outcome
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")


def receive(mailbox, **message_fields) -> int:
    return ingest_message(mailbox, **message_fields).inbox_event_id


def drive(event_id, rounds=50) -> str:
    """Process until the event is settled, as the sweeps would hand it back after each wait."""
    outcome = ""
    for _ in range(rounds):
        outcome = process_inbox_event(event_id)
        if InboxEvent.objects.get(pk=event_id).state not in InboxEvent.OPEN_STATES:
            return outcome
        InboxEvent.objects.filter(pk=event_id).update(retry_at=None)
        time.sleep(0.02)
    return outcome


def original(mailbox, sender="jane@example.com") -> tuple[int, TicketMapping]:
    event_id = receive(mailbox, sender=sender, message_id="<root@example.com>", subject="Printer")
    assert process_inbox_event(event_id) == "created"
    return event_id, TicketMapping.objects.get(inbox_event_id=event_id)


def test_a_reply_becomes_one_comment_on_the_same_ticket(mailbox):
    _, mapping = original(mailbox)
    reply = receive(
        mailbox,
        sender="jane@example.com",
        subject="Re: Printer",
        body="Still on fire.",
        extra_headers={"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"},
    )
    assert process_inbox_event(reply) == "created"
    assert process_inbox_event(reply) == "done"
    [comment] = TicketComment.objects.all()
    assert comment.ticket_id == int(mapping.ticket_id) and comment.body.startswith("Still on fire.")
    reply_mapping = TicketMapping.objects.get(inbox_event_id=reply)
    assert (reply_mapping.action, reply_mapping.ticket_id) == ("add_comment", mapping.ticket_id)
    assert Ticket.objects.count() == 1
    assert not Intent.objects.filter(inbox_event_id=reply, action="notify_requester").exists()


@pytest.mark.django_db(transaction=True)
def test_two_replies_processed_concurrently_are_two_comments_in_arrival_order(mailbox):
    _, mapping = original(mailbox)
    headers = {"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"}
    first = receive(mailbox, sender="jane@example.com", body="first reply", extra_headers=headers)
    second = receive(mailbox, sender="jane@example.com", body="second reply", extra_headers=headers)
    barrier = threading.Barrier(2)
    errors = []

    def work(event_id):
        try:
            barrier.wait()
            drive(event_id)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    # The later reply is started first: it must still wait for the earlier one.
    threads = [threading.Thread(target=work, args=(e,)) for e in (second, first)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    comments = list(TicketComment.objects.order_by("pk").values_list("body", flat=True))
    assert [c.strip() for c in comments] == ["first reply", "second reply"]
    assert TicketMapping.objects.filter(action="add_comment", ticket_id=mapping.ticket_id).count() == 2
    assert ThreadLease.objects.count() == 0  # both released


def test_a_reply_waits_while_the_original_is_still_open(mailbox):
    root = receive(mailbox, message_id="<root@example.com>")
    reply = receive(mailbox, extra_headers={"In-Reply-To": "<root@example.com>"})
    assert process_inbox_event(reply) == Outcome.WAITING_FOR_THREAD
    assert process_inbox_event(root) == "created"
    InboxEvent.objects.filter(pk=reply).update(retry_at=None)
    assert process_inbox_event(reply) == "created"
    assert TicketComment.objects.count() == 1 and Ticket.objects.count() == 1


def test_a_stranger_with_someone_elses_ticket_token_gets_a_new_flagged_ticket(mailbox):
    _, mapping = original(mailbox, sender="jane@example.com")
    stranger = receive(mailbox, sender="mallory@evil.example", subject=f"[#MR-{mapping.pk}] add me")
    assert process_inbox_event(stranger) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2
    event = InboxEvent.objects.get(pk=stranger)
    assert event.details["flags"] == ["untrusted_ticket_token"]
    assert TicketMapping.objects.get(inbox_event_id=stranger).ticket_id != mapping.ticket_id


def test_a_participant_with_the_ticket_token_comments_on_it(mailbox):
    _, mapping = original(mailbox, sender="jane@example.com")
    follow_up = receive(mailbox, sender="Jane@Example.com", subject=f"Re: [#MR-{mapping.pk}] Printer")
    assert process_inbox_event(follow_up) == "created"
    assert TicketComment.objects.get().ticket_id == int(mapping.ticket_id)


def test_a_strangers_reply_by_headers_to_someone_elses_thread_gets_a_new_flagged_ticket(mailbox):
    """In-Reply-To/References are as easy to copy as a ticket token: the same participant check applies."""
    _, mapping = original(mailbox, sender="jane@example.com")
    headers = {"In-Reply-To": "<root@example.com>", "References": "<root@example.com>"}
    stranger = receive(
        mailbox, sender="mallory@evil.example", subject="Re: Printer", body="add me", extra_headers=headers
    )
    assert process_inbox_event(stranger) == "created"
    assert TicketComment.objects.count() == 0 and Ticket.objects.count() == 2
    event = InboxEvent.objects.get(pk=stranger)
    assert event.details["flags"] == ["untrusted_thread_reply"]
    flagged = event.audit_events.get(kind="flagged")
    assert flagged.detail == {"flags": ["untrusted_thread_reply"]}
    new_ticket = TicketMapping.objects.get(inbox_event_id=stranger)
    assert new_ticket.action == "create_ticket" and new_ticket.ticket_id != mapping.ticket_id
    assert "mailroom-untrusted-thread-reply" in Ticket.objects.get(pk=int(new_ticket.ticket_id)).tags

    # The requester's own reply in the same thread still comments on her ticket, and only there.
    follow_up = receive(
        mailbox, sender="Jane@Example.com", subject="Re: Printer", body="Still broken.", extra_headers=headers
    )
    assert process_inbox_event(follow_up) == "created"
    [comment] = TicketComment.objects.all()
    assert comment.ticket_id == int(mapping.ticket_id)
    assert "flags" not in InboxEvent.objects.get(pk=follow_up).details  # not even "ambiguous_thread"
    # And the stranger's next reply joins the stranger's own ticket, not Jane's.
    again = receive(mailbox, sender="mallory@evil.example", subject="Re: Printer", body="hello?", extra_headers=headers)
    assert process_inbox_event(again) == "created"
    assert TicketComment.objects.get(body__startswith="hello?").ticket_id == int(new_ticket.ticket_id)


PROCESS_SCRIPT = r"""
import sys, django
django.setup()
from ticketing import services
print(services.process_inbox_event(int(sys.argv[1])))
"""


def test_a_worker_whose_lease_expired_mid_analysis_makes_no_call(live_mailbox, tmp_path, monkeypatch, desk):
    """Real processes against FakeDesk: the stale worker resumes after a takeover and writes nothing;
    its release leaves the newer lease in place."""
    from ticketing.models import Destination

    monkeypatch.setenv("DESK_CREDENTIALS", f"agent@acme.test/token:{desk.token}")
    Destination.objects.filter(tenant=live_mailbox.tenant).update(is_default=False)
    Destination.objects.create(
        tenant=live_mailbox.tenant,
        slug="desk",
        kind="zendesk",
        base_url=desk.url,
        is_default=True,
        credentials_ref="env:DESK_CREDENTIALS",
        settings={"read_timeout": 2},
    )
    root = receive(live_mailbox, message_id="<root@example.com>", to="support@live.mailroom.test")
    assert process_inbox_event(root) == "created"
    reply = receive(live_mailbox, to="support@live.mailroom.test", extra_headers={"In-Reply-To": "<root@example.com>"})
    connection.close()

    def start(point, pause, lease_seconds):
        env = subprocess_env(
            MAILROOM_PAUSE_AT=f"{point}:{pause}", MAILROOM_THREAD_LEASE_SECONDS=lease_seconds, MAILROOM_CLAMD="off"
        )
        return subprocess.Popen(
            [PYTHON, "-c", PROCESS_SCRIPT, str(reply)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    stale_pause, fresh_pause = tmp_path / "stale", tmp_path / "fresh"
    stale = start("thread_analysis", stale_pause, 1)
    wait_for(lambda: stale_pause.with_name("stale.reached").exists(), timeout=30)
    time.sleep(1.5)  # the stale worker's lease runs out while it is "analysing"
    fresh = start("before_destination_call", fresh_pause, 60)
    wait_for(lambda: fresh_pause.with_name("fresh.reached").exists(), timeout=30)
    lease = ThreadLease.objects.get()
    assert lease.token == 2

    stale_pause.with_name("stale.release").touch()
    out, err = stale.communicate(timeout=30)
    assert stale.returncode == 0, err
    assert out.strip() in ("busy", "done")
    assert ThreadLease.objects.get().token == 2  # the stale release left the newer lease alone
    assert not [r for r in desk.requests_log() if r["method"] == "PUT"]

    fresh_pause.with_name("fresh.release").touch()
    out, err = fresh.communicate(timeout=30)
    assert out.strip() == "created", err
    puts = [r for r in desk.requests_log() if r["method"] == "PUT"]
    assert len(puts) == 1
    assert TicketMapping.objects.filter(inbox_event_id=reply, action="add_comment").count() == 1
    assert ThreadLease.objects.count() == 0


def test_the_thread_key_from_headers_at_ingest_matches_the_full_parse():
    from intake.keys import thread_key_for_raw
    from intake.mime import parse_message
    from intake.validation import thread_key
    from tests.support.mime import generated_corpus, stdlib_corpus

    corpus = [raw for _, raw in stdlib_corpus() + generated_corpus()] + [
        email_message(extra_headers={"References": "<a@x> <b@x>", "In-Reply-To": "<b@x>"}),
        email_message(extra_headers={"In-Reply-To": "Re: your message <c@x> of Monday"}),
    ]
    mismatches = [raw[:60] for raw in corpus if thread_key_for_raw(raw) != thread_key(parse_message(raw))]
    assert mismatches == []
