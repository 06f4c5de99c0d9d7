"""Run the rehearsal set against a FakeDesk and tabulate the outcome."""
import logging
from dataclasses import dataclass

from .scenarios import SCENARIOS, Observation, Scenario
from .scratch import Scratch

logger = logging.getLogger(__name__)


@dataclass
class Result:
    scenario: Scenario
    observed: Observation | None
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and self.observed is not None and self.observed.matches(self.scenario.expect)


def run_drill(desk, scenarios=None) -> tuple[Scratch, list[Result]]:
    """Every scenario, in order, in a new scratch tenant; `desk` is a DeskClient for a FakeDesk."""
    drill = Scratch(desk)
    results = []
    try:
        for scenario in scenarios if scenarios is not None else SCENARIOS:
            desk.set_plan([])
            try:
                results.append(Result(scenario, scenario.run(drill)))
            except Exception as exc:  # a crash is a failed scenario, not the end of the drill
                logger.exception("drill scenario %s crashed", scenario.name)
                first_line = (str(exc).splitlines() or [""])[0][:200]
                results.append(Result(scenario, None, f"error: {type(exc).__name__}: {first_line}"))
    finally:
        drill.close()
    return drill, results


def format_table(results: list[Result]) -> str:
    header = ("scenario", "expected", "tickets", "queue state", "result")
    rows = [(r.scenario.name, r.scenario.expect.describe(),
             "-" if r.observed is None else str(r.observed.tickets),
             r.error if r.observed is None else r.observed.describe(), "pass" if r.passed else "FAIL")
            for r in results]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([line.format(*header), line.format(*("-" * w for w in widths)),
                      *(line.format(*row) for row in rows)])
