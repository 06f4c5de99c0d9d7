"""`manage.py drill`: the rehearsal set against its own FakeDesk, in a scratch tenant (reconciliation.drills)."""
import os
from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from intake.models import InboxEvent, Mailbox, Tenant
from reconciliation.drills import SCENARIOS, runner
from ticketing.models import Destination


@pytest.fixture(autouse=True)
def forget_drill_variables():
    yield
    for name in [name for name in os.environ if name.startswith("MAILROOM_T_DRILL_")]:  # the drill sets them
        del os.environ[name]


def test_every_scenario_passes_in_a_scratch_tenant_that_is_kept(tenant, mailbox):
    out = StringIO()
    call_command("drill", stdout=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].split() == ["scenario", "expected", "tickets", "queue", "state", "result"]
    for scenario in SCENARIOS:
        [row] = [line for line in lines if line.startswith(scenario.name + " ")]
        assert row.rstrip().endswith("pass"), row
    assert "FAIL" not in text and f"drill passed: {len(SCENARIOS)} scenarios" in text

    # Its own tenant, kept as evidence and paused; the other tenant untouched.
    [scratch] = Tenant.objects.filter(slug__startswith="drill-")
    assert scratch.slug in text
    states = set(InboxEvent.objects.filter(tenant=scratch).values_list("state", flat=True))
    assert states == {"completed", "failed", "awaiting_review"}  # every drill message settled
    assert not InboxEvent.objects.filter(tenant=tenant).exists()
    assert Mailbox.objects.get(tenant=scratch).paused and Destination.objects.get(tenant=scratch).paused
    assert not Mailbox.objects.get(pk=mailbox.pk).paused

    call_command("drill", stdout=StringIO())  # again, on a database that now has data: a new tenant
    assert Tenant.objects.filter(slug__startswith="drill-").count() == 2


def test_a_broken_expectation_fails_the_drill(db, monkeypatch):
    first = SCENARIOS[0]
    broken = replace(first, expect=replace(first.expect, tickets=first.expect.tickets + 1))
    monkeypatch.setattr(runner, "SCENARIOS", [broken])
    out = StringIO()
    with pytest.raises(CommandError, match=first.name):
        call_command("drill", stdout=out)
    [row] = [line for line in out.getvalue().splitlines() if line.startswith(first.name + " ")]
    assert row.rstrip().endswith("FAIL")


def test_the_drill_refuses_a_destination_that_is_not_a_fakedesk(db):
    from reconciliation.drills.scratch import NotAFakeDesk, Scratch

    class RealDesk:
        url = "https://example.zendesk.com"

    with pytest.raises(NotAFakeDesk):
        Scratch(RealDesk())
    assert not Tenant.objects.filter(slug__startswith="drill-").exists()
