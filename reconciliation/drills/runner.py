"""Run the rehearsal set against a FakeDesk, tabulate the outcome, and discard (or keep) the scratch tenant."""

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from .cleanup import discard
from .scenarios import SCENARIOS, Observation, Scenario
from .scratch import Scratch

logger = logging.getLogger(__name__)

HEADER = ("scenario", "expected", "tickets", "queue state", "result")


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


@dataclass
class Result:
    scenario: Scenario
    observed: Observation | None
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and self.observed is not None and self.observed.matches(self.scenario.expect)

    def cells(self) -> tuple[str, str, str, str, str]:
        """The table's row (HEADER), which the JSON report repeats."""
        return (
            self.scenario.name,
            self.scenario.expect.describe(),
            "-" if self.observed is None else str(self.observed.tickets),
            self.error if self.observed is None else self.observed.describe(),
            "pass" if self.passed else "FAIL",
        )


@dataclass
class DrillRun:
    """One run: its scratch tenant, each scenario's result, and what became of the tenant afterwards."""

    slug: str
    mailbox: str
    destination: str
    started_at: datetime
    kept: bool
    results: list[Result] = field(default_factory=list)
    finished_at: datetime | None = None
    discarded: dict[str, int] = field(default_factory=dict)  # rows deleted, by model label
    cleanup_error: str = ""

    @property
    def failed(self) -> list[str]:
        return [r.scenario.name for r in self.results if not r.passed]


def run_drill(desk, *, keep: bool = False, scenarios=None) -> DrillRun:
    """Every scenario, in order, in a new scratch tenant; `desk` is a DeskClient for a FakeDesk.

    Afterwards (also when interrupted) the tenant is discarded with everything it made, unless `keep`: then
    it stays as evidence, its mailbox and destination paused."""
    started = timezone.now()
    drill = Scratch(desk)
    run = DrillRun(
        slug=drill.slug, mailbox=drill.mailbox.slug, destination=str(drill.destination), started_at=started, kept=keep
    )
    try:
        for scenario in scenarios if scenarios is not None else SCENARIOS:
            desk.set_plan([])
            try:
                run.results.append(Result(scenario, scenario.run(drill)))
            except Exception as exc:  # a crash is a failed scenario, not the end of the drill
                logger.exception("drill scenario %s crashed", scenario.name)
                run.results.append(Result(scenario, None, f"error: {first_line(exc)}"))
    finally:
        drill.close()
        try:
            if keep:
                drill.keep()
            else:
                run.discarded = discard(slug=drill.slug)
        except Exception as exc:  # reported (and the command fails); the tenant stays, out of every live path
            logger.exception("drill tenant %s: %s failed", drill.slug, "keeping" if keep else "discarding")
            run.cleanup_error = first_line(exc)
        run.finished_at = timezone.now()
    return run


def format_table(results: list[Result]) -> str:
    rows = [r.cells() for r in results]
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(
        [line.format(*HEADER), line.format(*("-" * w for w in widths)), *(line.format(*row) for row in rows)]
    )
