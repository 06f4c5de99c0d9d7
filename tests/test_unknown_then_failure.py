"""No known failure after an unknown outcome (docs/design.md §6): an intent that was ever `unknown` and
then fails for good (its attempt cap, or a permanent answer) asks its destination by external reference
first; so does an operator's replay of one.

Found -> succeeded with the mapping; a consistent lookup finding nothing -> failed; a search that lags
or no lookup -> held, the event `unknown` (the recovery queue), never `failed`. Each kind runs against
its FakeDesk dialect on 127.0.0.1 (tests/destination_kits), driven through the pipeline and the sweep
functions, never by calling an adapter alone.
"""

import importlib
import socket
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from intake.models import AuditEvent, InboxEvent
from reconciliation import services as console
from reconciliation.selectors import recovery_queue
from reconciliation.services.access import ActionRefused
from tests.factories import ingest_message
from tests.live import free_port
from tests.mail import make_message
from tests.senderauth import trust_our_mta
from tests.support.acks import notify_intent, post
from tests.support.users import make_user
from ticketing import acknowledgments, intents
from ticketing.models import Destination, Intent, TicketMapping
from ticketing.services import process_inbox_event

pytestmark = pytest.mark.usefixtures("scanner_off")

CAP = 3
# Every kind with a lookup by external reference. ServiceNow in Import Set mode: the create coalesces
# (an upsert), so a 5xx after it is transient and the window below opens for it too.
KINDS_WITH_LOOKUP = ["zendesk", "servicenow", "salesforce", "hubspot", "rest", "jira_sm", "freshdesk"]
CONSISTENT = ["zendesk", "servicenow", "salesforce", "hubspot", "rest"]
LAGGING = ["jira_sm", "freshdesk"]
KIND_SETTINGS = {"servicenow": {"import_set_table": "u_mailroom_incident_import"}}


class Desk:
    """One kind's destination against its running fake."""

    def __init__(self, kit, desk, destination):
        self.kit, self.desk, self.destination = kit, desk, destination

    def records(self) -> list[dict]:
        return self.desk.tickets()

    def faults(self) -> list:
        return [w["fault"] for w in self.desk.requests_log()]

    def set(self, **settings):
        self.destination.settings = {**self.destination.settings, **settings}
        self.destination.save()


def start(kind, tenant, desk_factory, monkeypatch, desk_options: dict | None = None, **settings) -> Desk:
    kit = importlib.import_module(f"tests.destination_kits.{kind}")
    desk = desk_factory(dialect=kit.DIALECT, **{**kit.DESK_OPTIONS, **(desk_options or {})})
    destination = kit.configure(
        tenant, desk, monkeypatch, **{"max_attempts": CAP, **KIND_SETTINGS.get(kind, {}), **settings}
    )
    return Desk(kit, desk, destination)


@pytest.fixture
def operator(tenant):
    return make_user("oper", groups=["operator"], tenants=[tenant])


def new_event(mailbox) -> int:
    return ingest_message(
        mailbox, sender="Alice Example <alice@customer.test>", subject="Invoice 4471 charged twice"
    ).inbox_event_id


def intent_of(event_id, action="create_ticket") -> Intent:
    return Intent.objects.get(inbox_event_id=event_id, action=action)


def event_of(event_id) -> InboxEvent:
    return InboxEvent.objects.get(pk=event_id)


def audit(event_id, kind) -> list[dict]:
    return list(
        AuditEvent.objects.filter(inbox_event_id=event_id, kind=kind)
        .order_by("at", "pk")
        .values_list("detail", flat=True)
    )


def drive(event_id, seconds: float = 20.0) -> str:
    """What workers and sweeps do, repeated until the intent rests: due attempts are made at once,
    unknown ones go through `resolve_unknown` (a lagging search waits for its settle delay)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        intent = intent_of(event_id)
        if intent.state == "unknown":
            intents.resolve_unknown(intent.pk)
        elif intent.state in ("pending", "retry_wait"):
            Intent.objects.filter(pk=intent.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
            process_inbox_event(event_id)
        else:
            return intent.state
        time.sleep(0.05)
    raise AssertionError(f"intent still {intent_of(event_id).state} after {seconds}s")


def held_after_unknown(d: Desk, mailbox, first_fault: str) -> int:
    """An event whose first create's answer was lost, then 500s until the cap, on a destination that
    cannot be asked (Zendesk with its lookup off): held, the event unknown/failed_after_unknown."""
    d.set(lookup_supported=False)
    d.desk.set_plan([first_fault] + ["error_500"] * (CAP - 1))
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert drive(event_id) == "held"
    event = event_of(event_id)
    assert (event.state, event.reason_code) == ("unknown", "failed_after_unknown")
    return event_id


# --- the failure window ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS_WITH_LOOKUP)
def test_lost_answer_after_the_commit_then_500s_until_the_cap_ends_completed(
    kind, tenant, mailbox, desk_factory, monkeypatch
):
    d = start(kind, tenant, desk_factory, monkeypatch)
    d.desk.set_plan(["drop_after_commit"] + ["error_500"] * CAP)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert len(d.records()) == 1  # the destination committed; the answer was lost

    assert drive(event_id) == "succeeded"
    [record] = d.records()
    mapping = TicketMapping.objects.get(inbox_event_id=event_id)
    assert mapping.ticket_id == d.kit.ticket_id_of(record)
    assert record["external_id"] == intent_of(event_id).external_ref
    assert event_of(event_id).state == "completed"
    assert audit(event_id, "intent_failed") == []
    if kind not in LAGGING:
        # The retry was safe (key / upsert), 500s ran into the cap, and the lookup found the record.
        assert d.faults() == ["drop_after_commit"] + ["error_500"] * (CAP - 1)
        [created] = audit(event_id, "ticket_created")
        assert created["settled_by"] == "lookup" and created["instead_of"] == "retries_exhausted"
    else:  # no retry is safe: the lagging search settled the unknown outcome, no write was sent again
        assert d.faults() == ["drop_after_commit"]


@pytest.mark.parametrize("kind", CONSISTENT)
def test_a_consistent_lookup_finding_nothing_at_the_cap_is_a_known_failure(
    kind, tenant, mailbox, desk_factory, monkeypatch
):
    d = start(kind, tenant, desk_factory, monkeypatch)
    d.desk.set_plan(["drop_before_commit"] + ["error_500"] * CAP)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert drive(event_id) == "failed"
    event = event_of(event_id)
    assert (event.state, event.reason_code) == ("failed", "retries_exhausted")
    [failed] = audit(event_id, "intent_failed")
    assert failed["lookup"] == "nothing"
    assert d.records() == [] and not TicketMapping.objects.filter(inbox_event_id=event_id).exists()


@pytest.mark.parametrize("first_fault,final", [("drop_after_commit", "succeeded"), ("drop_before_commit", "failed")])
@pytest.mark.parametrize("kind", CONSISTENT)
def test_a_422_after_an_unknown_outcome_asks_the_destination_first(
    kind, first_fault, final, tenant, mailbox, desk_factory, monkeypatch
):
    d = start(kind, tenant, desk_factory, monkeypatch)
    d.desk.set_plan([first_fault, "reject_422"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert drive(event_id) == final
    assert d.faults() == [first_fault, "reject_422"]
    event = event_of(event_id)
    if final == "succeeded":
        [record] = d.records()
        assert event.state == "completed"
        assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == d.kit.ticket_id_of(record)
        [created] = audit(event_id, "ticket_created")
        assert created["instead_of"] == "invalid_fields"
    else:  # nothing was made: the 422 is what it says
        assert (event.state, event.reason_code) == ("failed", "invalid_fields")
        assert d.records() == []


def test_no_lookup_at_the_cap_holds_the_item_as_unknown_not_failed(tenant, mailbox, desk_factory, monkeypatch):
    # REST with an idempotency key (a retry is safe) and no lookup declared.
    d = start("rest", tenant, desk_factory, monkeypatch, lookup_url_template="")
    d.desk.set_plan(["drop_after_commit"] + ["error_500"] * CAP)
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert drive(event_id) == "held"
    event = event_of(event_id)
    assert (event.state, event.reason_code) == ("unknown", "failed_after_unknown")
    assert "retries_exhausted" in event.reason_detail and "no lookup" in event.reason_detail
    assert event in recovery_queue()
    assert audit(event_id, "intent_failed") == []
    assert len(d.records()) == 1 and not TicketMapping.objects.filter(inbox_event_id=event_id).exists()
    # The sweeps leave it to a person: nothing is sent again.
    intents.resolve_unknown_intents()
    intents.enqueue_due(lost_after_seconds=0)
    assert intent_of(event_id).state == "held" and len(d.faults()) == CAP


@pytest.mark.parametrize("first_fault,final", [("drop_after_commit", "succeeded"), ("drop_before_commit", "held")])
@pytest.mark.parametrize("kind", LAGGING)
def test_a_lagging_search_at_the_cap_is_asked_after_its_settle_delay(
    kind, first_fault, final, tenant, mailbox, desk_factory, monkeypatch
):
    d = start(kind, tenant, desk_factory, monkeypatch, max_attempts=2)
    d.desk.set_plan([first_fault, "rate_limit:0"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    # Another attempt of the unknown intent (as a replay of an earlier release made one without asking).
    assert intents.reopen(intent_of(event_id), timezone.now(), "test", "idempotency_key_retained") == "pending"
    assert process_inbox_event(event_id) == "unknown"  # the 429 at the cap: the search is not due yet
    event = event_of(event_id)
    assert (event.state, event.reason_code) == ("unknown", "asking_after_unknown")
    assert intents.awaits_lookup(intent_of(event_id))

    assert drive(event_id) == final
    assert d.faults() == [first_fault, "rate_limit:0"]  # nothing was sent again
    assert audit(event_id, "intent_failed") == []
    event = event_of(event_id)
    if final == "succeeded":
        [record] = d.records()
        assert event.state == "completed"
        assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == d.kit.ticket_id_of(record)
    else:
        assert (event.state, event.reason_code) == ("unknown", "search_found_nothing")
        assert event in recovery_queue()


def test_the_settle_delay_counts_from_the_unknown_outcome_not_from_the_park(tenant, mailbox, desk_factory, monkeypatch):
    # A search that lags 60 s (the fake's own index sees writes at once: what is asked is when).
    d = start(
        "jira_sm",
        tenant,
        desk_factory,
        monkeypatch,
        desk_options={"search_lag_seconds": 0},
        max_attempts=2,
        search_settle_seconds=60,
    )
    d.desk.set_plan(["drop_after_commit", "rate_limit:0"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert intents.reopen(intent_of(event_id), timezone.now(), "test", "idempotency_key_retained") == "pending"
    assert process_inbox_event(event_id) == "unknown"  # the 429 at the cap, parked: not due yet
    ambiguous, park = audit(event_id, "intent_unknown")
    assert park["parked"] is True and "parked" not in ambiguous
    # The minute passes for the ambiguous attempt's row only: the park was written just now.
    unknown_at = timezone.now() - timedelta(seconds=61)
    rows = AuditEvent.objects.filter(inbox_event_id=event_id, kind="intent_unknown")
    assert rows.exclude(detail__has_key="parked").update(at=unknown_at) == 1
    assert intents.last_unknown_at(intent_of(event_id)) == unknown_at

    assert intents.resolve_unknown(intent_of(event_id).pk) == "succeeded"  # asked now, not a minute later
    [record] = d.records()
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == d.kit.ticket_id_of(record)
    assert d.faults() == ["drop_after_commit", "rate_limit:0"]


# --- the claim runs out while the destination is asked ------------------------------------------------


def claim_runs_out_during_the_lookup(d: Desk, event_id: int, *, then_another_worker: bool) -> dict:
    """Worker A's attempt at the cap, after an unknown outcome, asks the desk; while the lookup is on the
    wire, A's claim runs out and the sweep expires it. With `then_another_worker`, the intent is also
    reopened and worker B claims it and calls the desk (its create held until A is done). Returns each
    worker's outcome. Hooks run on the desk's threads, with their own database connections."""
    intent_id = intent_of(event_id).pk
    b_calling, a_done, outcomes, errors = threading.Event(), threading.Event(), {}, []

    def worker_b():
        try:
            outcomes["b"] = process_inbox_event(event_id, worker="worker-b")
        finally:
            connection.close()

    def on_request(request):
        try:
            if request.method == "POST" and b_thread.ident is not None and not b_calling.is_set():  # B's create
                b_calling.set()
                assert a_done.wait(30), "worker A never finished"
            elif request.method == "GET" and "external_id" in request.query and not lookups:
                lookups.append(request.path)
                Intent.objects.filter(pk=intent_id).update(claimed_until=timezone.now() - timedelta(seconds=1))
                assert intents.expire_claims() == 1
                if then_another_worker:
                    assert intents.resolve_unknown(intent_id) == "pending"  # the key is kept: a retry is safe
                    b_thread.start()
                    assert b_calling.wait(30), "worker B never called the desk"
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            connection.close()
        return None

    lookups: list = []
    b_thread = threading.Thread(target=worker_b)
    remove = d.desk.on_request(on_request)
    try:
        outcomes["a"] = process_inbox_event(event_id, worker="worker-a")
    finally:
        a_done.set()
        if then_another_worker and b_thread.ident is not None:
            b_thread.join(60)
        remove()
    assert not errors and lookups
    return outcomes


def reopened_after_a_lost_answer(tenant, mailbox, desk_factory, monkeypatch) -> tuple[Desk, int]:
    """Worker A's create is answered after the desk committed (lost), the unknown is reopened; the next
    attempt draws a 500 at the cap of 2, so A asks the desk before calling it a failure."""
    d = start("zendesk", tenant, desk_factory, monkeypatch, max_attempts=2, read_timeout=10.0)
    d.desk.set_plan(["drop_after_commit", "error_500"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id, worker="worker-a") == "unknown"
    assert intents.resolve_unknown(intent_of(event_id).pk) == "pending"
    return d, event_id


@pytest.mark.django_db(transaction=True)
def test_a_found_ticket_is_left_to_the_worker_that_claimed_the_intent_meanwhile(
    transactional_db, tenant, mailbox, desk_factory, monkeypatch
):
    d, event_id = reopened_after_a_lost_answer(tenant, mailbox, desk_factory, monkeypatch)

    outcomes = claim_runs_out_during_the_lookup(d, event_id, then_another_worker=True)
    # A's lookup found the ticket, but the intent was B's by then: A records nothing, B's success counts.
    assert outcomes == {"a": "claim_lost", "b": "created"}
    intent = intent_of(event_id)
    assert (intent.state, intent.claimed_by) == ("succeeded", "worker-b")
    [record] = d.records()
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(record["id"])
    [created] = AuditEvent.objects.filter(inbox_event_id=event_id, kind="ticket_created")
    assert created.actor == "worker:worker-b" and "settled_by" not in created.detail
    assert event_of(event_id).state == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_found_ticket_settles_the_attempt_whose_claim_ran_out_while_it_asked(
    transactional_db, tenant, mailbox, desk_factory, monkeypatch
):
    d, event_id = reopened_after_a_lost_answer(tenant, mailbox, desk_factory, monkeypatch)

    outcomes = claim_runs_out_during_the_lookup(d, event_id, then_another_worker=False)
    assert outcomes == {"a": "succeeded"}  # unknown/claim_expired, still A's: the ticket found settles it
    [record] = d.records()
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(record["id"])
    [created] = audit(event_id, "ticket_created")
    assert (created["settled_by"], created["instead_of"]) == ("lookup", "retries_exhausted")
    assert event_of(event_id).state == "completed"


# --- operator replay --------------------------------------------------------------------------------


def test_replay_links_the_ticket_the_lookup_finds_and_writes_nothing(
    tenant, mailbox, desk_factory, monkeypatch, operator
):
    d = start("zendesk", tenant, desk_factory, monkeypatch)
    event_id = held_after_unknown(d, mailbox, "drop_after_commit")
    writes = len(d.faults())
    d.set(lookup_supported=True)  # the destination can be asked now

    assert console.do_replay(operator, event_id) == "linked"
    [record] = d.records()
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(record["id"])
    assert event_of(event_id).state == "completed" and intent_of(event_id).state == "succeeded"
    assert len(d.faults()) == writes
    [replayed] = audit(event_id, "replayed")
    assert (replayed["outcome"], replayed["ticket_id"]) == ("linked", str(record["id"]))


def test_replay_goes_on_when_a_consistent_lookup_finds_nothing(tenant, mailbox, desk_factory, monkeypatch, operator):
    d = start("zendesk", tenant, desk_factory, monkeypatch)
    event_id = held_after_unknown(d, mailbox, "drop_before_commit")
    d.set(lookup_supported=True)

    assert console.do_replay(operator, event_id) == "reopened"
    assert audit(event_id, "replayed")[0]["lookup"] == "nothing"
    assert process_inbox_event(event_id) == "created"
    [record] = d.records()
    assert TicketMapping.objects.get(inbox_event_id=event_id).ticket_id == str(record["id"])


def test_replay_without_a_lookup_is_refused_and_the_item_stays(tenant, mailbox, desk_factory, monkeypatch, operator):
    d = start("zendesk", tenant, desk_factory, monkeypatch)
    event_id = held_after_unknown(d, mailbox, "drop_after_commit")
    writes = len(d.faults())

    with pytest.raises(ActionRefused, match="earlier attempt's outcome is unknown.*offers no lookup"):
        console.do_replay(operator, event_id)
    with pytest.raises(ActionRefused, match="offers no lookup"):
        console.do_correct_and_replay(operator, event_id, destination_id=d.destination.pk, queue="billing")
    [item] = console.do_bulk_replay_preview(operator, [event_id])
    assert item.plan == "skip" and "earlier attempt's outcome is unknown" in item.plan_text
    assert console.do_bulk_replay(operator, [event_id])[0].outcome == "skipped"

    assert intent_of(event_id).state == "held" and event_of(event_id).state == "unknown"
    assert event_of(event_id) in recovery_queue()
    assert audit(event_id, "replayed") == [] and len(d.faults()) == writes


def test_replay_is_refused_while_the_lookup_fails(tenant, mailbox, desk_factory, monkeypatch, operator):
    d = start("zendesk", tenant, desk_factory, monkeypatch)
    event_id = held_after_unknown(d, mailbox, "drop_after_commit")
    d.set(lookup_supported=True)
    remove = d.desk.on_request(lambda request: (500, {"error": "down"}) if request.method == "GET" else None)
    with pytest.raises(ActionRefused, match="lookup failed for now"):
        console.do_replay(operator, event_id)
    assert intent_of(event_id).state == "held"
    remove()
    assert console.do_replay(operator, event_id) == "linked"


@pytest.mark.parametrize("kind", LAGGING)
def test_replay_after_a_lagging_search_found_nothing_is_refused(
    kind, tenant, mailbox, desk_factory, monkeypatch, operator
):
    d = start(kind, tenant, desk_factory, monkeypatch)
    d.desk.set_plan(["drop_before_commit"])
    event_id = new_event(mailbox)
    assert process_inbox_event(event_id) == "unknown"
    assert drive(event_id) == "held"
    assert event_of(event_id).reason_code == "search_found_nothing"

    with pytest.raises(ActionRefused, match="lags behind its writes, found no record"):
        console.do_replay(operator, event_id)
    assert intent_of(event_id).state == "held" and event_of(event_id) in recovery_queue()
    assert d.faults() == ["drop_before_commit"]


# --- an acknowledgment (no lookup: SMTP) ----------------------------------------------------------------


def test_an_acknowledgment_refused_at_the_cap_after_a_timeout_is_held_not_failed(mailbox, settings):
    trust_our_mta(mailbox)
    Destination.objects.filter(tenant=mailbox.tenant).update(settings={"max_attempts": 2})
    event_id = post(make_message())
    assert process_inbox_event(event_id) == "created"
    ack = notify_intent(event_id)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never greets: the send times out
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", silent.getsockname()[1]
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.MAILROOM_SMTP_TIMEOUT = 0.5
    try:
        assert acknowledgments.send(ack.pk, "w") == "unknown"
    finally:
        silent.close()
    assert intents.resolve_unknown(ack.pk) == "held"  # SMTP keeps no key: a person decides
    assert (
        console.do_replay(make_user("oper", groups=["operator"], tenants=[mailbox.tenant]), event_id)
        == "acknowledgment_reopened"
    )

    settings.EMAIL_PORT = free_port()  # nothing listens: refused, a transient failure each time
    assert acknowledgments.send(ack.pk, "w") == "retry_wait"
    Intent.objects.filter(pk=ack.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    assert acknowledgments.send(ack.pk, "w") == "held"  # not failed: the first email may have gone out
    assert event_of(event_id).state == "completed"  # its ticket exists; only the email is in doubt
    assert audit(event_id, "intent_held")[-1]["lookup"] == "cannot"


def test_the_console_says_a_replay_linked_the_ticket_it_found(
    tenant, mailbox, desk_factory, monkeypatch, operator, client
):
    from django.contrib.messages import get_messages

    from reconciliation.admin.item import LINKED_MESSAGE
    from tests.support.queue import act

    d = start("zendesk", tenant, desk_factory, monkeypatch)
    event_id = held_after_unknown(d, mailbox, "drop_after_commit")
    writes = len(d.faults())
    d.set(lookup_supported=True)
    client.force_login(operator)
    response = act(client, event_id, "replay")
    assert response.status_code == 302
    assert [m.message for m in get_messages(response.wsgi_request)] == [LINKED_MESSAGE]
    assert event_of(event_id).state == "completed" and len(d.faults()) == writes
