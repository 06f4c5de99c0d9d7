"""The rehearsal set behind `manage.py drill` (the contract: exit non-zero on any failed scenario).

Each scenario sends synthetic mail through the real code path, in this process:
`intake.services.ingest` -> `ticketing.services.process_inbox_event`, with the sweeps' own per-intent
transitions (`intents.expire`, `intents.requeue`, `intents.resolve_unknown`) run directly, scoped to the
drill's events, and time advanced by moving `next_attempt_at` / `claimed_until` / `retry_at` in the
database. The destination is always a FakeDesk the command started itself on 127.0.0.1: `run_drill`
checks that it answers FakeDesk's control API before anything is sent.

Every run works in a scratch tenant of its own (`drill-<timestamp>-<hex>`: mailbox, zendesk destination),
so it runs on a fresh database or a busy one and touches no other tenant. The tenant is marked
`Tenant.is_drill`, and every live path leaves its rows to this process, so the drill runs while the
stack runs: the Celery task drops its events (`ticketing.tasks.process_inbox_events`), the intent and
intake sweeps, the reconcilers, escalation and the breaker's emails skip it, and /metrics leaves it out.

Afterwards the tenant and every row it made are deleted in one transaction (`cleanup.discard`), so the
queue, the pauses, the admin's filters and /metrics are as the drill found them; the printed table and
the JSON report (`report`) are the evidence. With `--keep` the rows stay instead, the scratch mailbox and
destination paused (`manage.py drill --discard SLUG` removes them later).
"""

from .runner import DrillRun, Result, format_table, run_drill  # noqa: F401
from .scenarios import SCENARIOS, Expectation, Observation, Scenario  # noqa: F401
