"""The rehearsal set: one function per scenario, each with the outcome it must end in."""

from dataclasses import dataclass, field

from django.conf import settings
from django.test.utils import override_settings

from intake.mime import parse_message
from intake.models import InboxEvent
from ticketing import breaker, intents
from ticketing.execution import Work
from ticketing.models import Intent
from ticketing.outcomes import Outcome

from .scratch import PDF, Scratch, closed_port


@dataclass(frozen=True)
class Expectation:
    tickets: int  # new tickets in the destination
    event: str  # "state" or "state/reason"
    intent: str | None  # the current intent's state; None: no intent
    in_queue: bool  # in the recovery queue

    def describe(self) -> str:
        where = "in queue" if self.in_queue else "not in queue"
        return f"{self.tickets} ticket{'s' if self.tickets != 1 else ''}, {self.event}, {where}"


@dataclass
class Observation:
    tickets: int
    event: str
    intent: str | None
    in_queue: bool
    problems: list[str] = field(default_factory=list)  # a scenario's own checks that did not hold

    def matches(self, expected: Expectation) -> bool:
        return not self.problems and (self.tickets, self.event, self.intent, self.in_queue) == (
            expected.tickets,
            expected.event,
            expected.intent,
            expected.in_queue,
        )

    def describe(self) -> str:
        text = f"event {self.event}, intent {self.intent or '-'}{', in queue' if self.in_queue else ''}"
        return text + "".join(f"; {p}" for p in self.problems)


@dataclass
class Scenario:
    name: str
    expect: Expectation
    run: object  # (Scratch) -> Observation


def observe(drill: Scratch, event_id: int, tickets_before: int, problems: list[str]) -> Observation:
    event = InboxEvent.objects.get(pk=event_id)
    intent = drill.intent(event_id)
    if event.state == InboxEvent.State.COMPLETED and not drill.mapping_matches_desk(event_id):
        problems.append("mapping does not match the desk's ticket")
    return Observation(
        tickets=drill.ticket_count() - tickets_before,
        event=f"{event.state}/{event.reason_code}" if event.reason_code else event.state,
        intent=intent.state if intent else None,
        in_queue=drill.in_queue(event_id),
        problems=problems,
    )


def check(problems: list[str], ok: bool, what: str) -> None:
    if not ok:
        problems.append(what)


# --- the scenarios ----------------------------------------------------------------------------------------


def duplicate_delivery(drill: Scratch) -> Observation:
    before, problems = drill.ticket_count(), []
    raw = drill.message("Invoice 4411 charged twice", "My card was charged twice for invoice 4411.")
    first, again = drill.deliver(raw), drill.deliver(raw)  # the provider retried its webhook
    check(problems, again.duplicate and again.inbox_event_id == first.inbox_event_id, "redelivery stored twice")
    outcomes = [drill.process(first.inbox_event_id), drill.process(again.inbox_event_id)]
    check(problems, outcomes == [Outcome.CREATED, Outcome.DONE], f"outcomes {outcomes}")
    return observe(drill, first.inbox_event_id, before, problems)


def rate_limit(drill: Scratch) -> Observation:
    before, mark, problems = drill.ticket_count(), drill.log_mark(), []
    drill.desk.set_plan(["rate_limit:1"])
    event_id = drill.deliver(drill.message("Cannot log in", "The login page says my account is locked.")).inbox_event_id
    check(problems, drill.process(event_id) == Outcome.RETRY_WAIT, "429 not turned into a retry")
    check(problems, drill.sweep(event_id) == {}, "retried before Retry-After")
    drill.advance(event_id)
    check(problems, drill.sweep(event_id) == {"requeued": 1}, "the due retry was not requeued")
    check(problems, drill.process(event_id) == Outcome.CREATED, "the retry did not create the ticket")
    statuses = [r["status"] for r in drill.creates_since(mark)]
    check(problems, statuses == [429, 201], f"create requests answered {statuses}")
    return observe(drill, event_id, before, problems)


def invalid_field(drill: Scratch) -> Observation:
    before, mark, problems = drill.ticket_count(), drill.log_mark(), []
    drill.desk.set_plan(["reject_422"])
    event_id = drill.deliver(drill.message("Change my address", "Please update my delivery address.")).inbox_event_id
    check(problems, drill.process(event_id) == Outcome.FAILED, "422 did not fail the intent")
    drill.advance(event_id)
    drill.sweep(event_id)
    check(problems, drill.process(event_id) == Outcome.DONE, "a rejected write was tried again")
    check(problems, len(drill.creates_since(mark)) == 1, "more than one create request")
    return observe(drill, event_id, before, problems)


def worker_restart(drill: Scratch) -> Observation:
    """A worker claims the intent, its request writes the ticket, and it dies before recording it."""
    before, problems = drill.ticket_count(), []
    event_id = drill.deliver(
        drill.message("Order 88123 never arrived", "Tracking has not moved for a week.")
    ).inbox_event_id
    drill.set_paused(True)  # stop the drill's own worker right before the call, to play the doomed one
    try:
        check(problems, drill.process(event_id) == Outcome.PAUSED, "a paused destination was written to")
    finally:
        drill.set_paused(False)
    intent = drill.intent(event_id)
    event = InboxEvent.objects.get(pk=event_id)
    check(problems, intents.claim(intent.pk, worker="drill:doomed-worker"), "the doomed worker could not claim")
    parsed = parse_message(bytes(event.raw), loop_header=settings.MAILROOM_LOOP_HEADER)
    from ticketing.destinations import adapter_for

    Work(event, Intent.Action.CREATE_TICKET, parsed).perform(adapter_for(drill.destination), intent)
    # ... killed here: the desk has the ticket, Mailroom has a claim nobody will finish.
    check(problems, drill.process(event_id) == Outcome.BUSY, "a second worker took a live claim")
    drill.advance(event_id)  # the claim runs out
    swept = drill.sweep(event_id)
    check(problems, swept.get("expired") == 1, f"the claim did not expire ({swept})")
    check(problems, drill.process(event_id) in (Outcome.CREATED, Outcome.DONE), "not completed after the restart")
    return observe(drill, event_id, before, problems)


def timeout_after_write(drill: Scratch) -> Observation:
    before, problems = drill.ticket_count(), []
    drill.desk.set_plan(["stall_after_commit:2"])  # the desk writes, then answers after our 1 s read timeout
    event_id = drill.deliver(drill.message("VPN drops every hour", "The VPN client disconnects hourly.")).inbox_event_id
    check(problems, drill.process(event_id) == Outcome.UNKNOWN, "a timed-out write was not marked unknown")
    swept = drill.sweep(event_id)
    check(problems, "pending" in swept or "succeeded" in swept, f"unknown not resolved ({swept})")
    drill.process(event_id)
    return observe(drill, event_id, before, problems)


def no_idempotency(drill: Scratch) -> Observation:
    before, mark, problems = drill.ticket_count(), drill.log_mark(), []
    drill.configure(idempotency_supported=False)
    drill.desk.set_idempotency(enabled=False)
    try:
        drill.desk.set_plan(["drop_after_commit"])
        event_id = drill.deliver(
            drill.message("Refund request", "I returned the item, please refund me.")
        ).inbox_event_id
        check(problems, drill.process(event_id) == Outcome.UNKNOWN, "a lost answer was not marked unknown")
        swept = drill.sweep(event_id)
        check(problems, swept == {"succeeded": 1}, f"the lookup did not settle it ({swept})")
        check(problems, drill.process(event_id) == Outcome.DONE, "processed again after the lookup")
        check(problems, len(drill.creates_since(mark)) == 1, "created again without a key")
    finally:
        drill.desk.set_idempotency(enabled=True)
        drill.configure()
    return observe(drill, event_id, before, problems)


def scanner_down(drill: Scratch) -> Observation:
    before, problems = drill.ticket_count(), []
    raw = drill.message(
        "Signed contract attached",
        "Please find the signed contract attached.",
        attachment=("contract.pdf", "application/pdf", PDF),
    )
    event_id = drill.deliver(raw).inbox_event_id
    with override_settings(
        MAILROOM_CLAMD=f"tcp://127.0.0.1:{closed_port()}",
        MAILROOM_CLAMD_TIMEOUT=2,
        MAILROOM_SCAN_ATTEMPTS=2,
        MAILROOM_SCAN_RETRY_SECONDS=60,
    ):
        check(problems, drill.process(event_id) == Outcome.WAITING, "did not wait for the scanner")
        waiting = InboxEvent.objects.get(pk=event_id)
        check(problems, waiting.state == "received" and waiting.retry_at is not None, "the event is not waiting")
        drill.advance(event_id)
        drill.process(event_id)  # the last attempt
    return observe(drill, event_id, before, problems)


def expired_credentials(drill: Scratch) -> Observation:
    """401s: each item fails (credentials) until the breaker pauses the destination; then items wait."""
    before, mark, problems = drill.ticket_count(), drill.log_mark(), []
    with drill.credentials(f"{drill.desk.credentials}-expired"):
        first, second, third = (
            drill.deliver(drill.message(subject, body)).inbox_event_id
            for subject, body in (
                ("Printer offline", "The 3rd floor printer is offline."),
                ("Shared drive full", "The team share says it has no space left."),
                ("New starter laptop", "A laptop for our new starter on Monday, please."),
            )
        )
        check(problems, drill.process(first) == Outcome.FAILED, "a 401 did not fail the item")
        drill.advance(first)
        drill.sweep(first)
        check(problems, drill.process(first) == Outcome.DONE, "retried with bad credentials")
        # The second credentials failure in a row trips the breaker: that item, and the next, wait.
        check(problems, drill.process(second) == Outcome.RETRY_WAIT, "the tripping item did not wait")
        check(problems, drill.paused_by() == breaker.ACTOR, "the breaker did not pause the destination")
        check(problems, drill.process(third) == Outcome.PAUSED, "a new item did not wait on the paused destination")
    check(problems, len(drill.creates_since(mark)) == 2, "a request was sent while paused")
    drill.waiting = [second, third]
    return observe(drill, first, before, problems)


def resume_drains(drill: Scratch) -> Observation:
    """Credentials fixed, a person resumes the destination: the items that waited become tickets."""
    before, problems = drill.ticket_count(), []
    check(problems, len(drill.waiting) == 2, "nothing was waiting")
    if not drill.waiting:
        return Observation(0, "-", None, False, problems)
    drill.resume()
    for event_id in drill.waiting:
        drill.sweep(event_id)  # the waiting intent is due now
        check(problems, drill.process(event_id) == Outcome.CREATED, f"event {event_id} did not drain")
    check(
        problems,
        InboxEvent.objects.filter(pk__in=drill.waiting, state="completed").count() == 2,
        "not every waiting item completed",
    )
    return observe(drill, drill.waiting[-1], before, problems)


SCENARIOS = [
    Scenario("duplicate delivery", Expectation(1, "completed", "succeeded", False), duplicate_delivery),
    Scenario("rate limit (429)", Expectation(1, "completed", "succeeded", False), rate_limit),
    Scenario("invalid field (422)", Expectation(0, "failed/invalid_fields", "failed", True), invalid_field),
    Scenario("worker restart", Expectation(1, "completed", "succeeded", False), worker_restart),
    Scenario("timeout after write", Expectation(1, "completed", "succeeded", False), timeout_after_write),
    Scenario("no idempotency keys", Expectation(1, "completed", "succeeded", False), no_idempotency),
    Scenario("scanner down", Expectation(0, "awaiting_review/scanner_unavailable", None, True), scanner_down),
    Scenario("expired credentials (401)", Expectation(0, "failed/credentials", "failed", True), expired_credentials),
    Scenario("breaker resume drains", Expectation(2, "completed", "succeeded", False), resume_drains),
]
