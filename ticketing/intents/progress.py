"""The journal of an attempt (ticketing.destinations.journal) kept on its intent: `Intent.progress`.

Each `put` is one UPDATE guarded by the attempt's claim (in_flight, claimed by this worker), committed at
once: the step it records may be followed by a side effect, and an attempt that lost its claim must not
write over the next one's notes. The built-in store writes inside its own transaction, so there the
journal is the intent row in hand.
"""

from typing import Any

from django.db import transaction

from ..destinations.journal import Journal
from ..models import Intent
from .core import IntentState


class ClaimLost(Exception):
    """The attempt no longer holds its intent: stop before the next side effect."""


class IntentJournal(Journal):
    def __init__(self, intent: Intent, worker: str) -> None:
        self.intent, self.worker = intent, worker
        self.data: dict[str, Any] = dict(
            Intent.objects.filter(pk=intent.pk).values_list("progress", flat=True).first() or {}
        )

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def put(self, name: str, value: Any) -> None:
        data = {**self.data, name: value}
        with transaction.atomic():
            moved = Intent.objects.filter(
                pk=self.intent.pk, state=IntentState.IN_FLIGHT, claimed_by=self.worker
            ).update(progress=data)
        if not moved:
            raise ClaimLost(f"intent {self.intent.pk}: claim lost; step {name!r} not recorded")
        self.data = data
        self.intent.progress = data
