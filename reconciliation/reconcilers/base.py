"""What every reconciler shares: the run it records, its findings, its settings, a lock.

A pass is `recording(kind, scope)`: it creates the `ReconciliationRun`, hands the previous pass's
resume point (`resume`) to the reconciler, and finishes the run (counts, cursor, error) whatever
happens. A finding is opened at most once per (kind, object) while open (`finding_one_open_per_object`,
so a second pass, or two passes at once, never duplicate it) and resolved with a resolution.
"""

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from intake.failures import AmbiguousOutcome, PermanentError, TransientError
from intake.locks import exclusive

from ..models import Finding, ReconciliationRun

logger = logging.getLogger("reconciliation.reconcilers")

ALL = "(all)"  # the scope of a reconciler that is not per mailbox or destination (not a slug: no clash)
LOCK_NAMESPACE = 0x4D52524E  # "MRRN": the advisory lock of a reconciliation pass


def setting(name: str, default):
    return getattr(settings, name, default)


def window() -> timedelta:
    return timedelta(days=float(setting("MAILROOM_RECONCILE_WINDOW_DAYS", 3)))


def limit() -> int:
    return max(1, int(setting("MAILROOM_RECONCILE_LIMIT", 2000)))


@dataclass
class Summary:
    """One reconciler's pass over one scope, for the command's output and the beat task's result."""

    kind: str
    scope: str
    scanned: int = 0
    findings: int = 0
    repaired: int = 0
    error: str = ""
    skipped: str = ""
    more: bool = False

    def line(self) -> str:
        if self.skipped:
            return f"{self.kind:<12} {self.scope}: skipped ({self.skipped})"
        text = (
            f"{self.kind:<12} {self.scope}: scanned {self.scanned}, findings {self.findings}, repaired {self.repaired}"
        )
        if self.more:
            text += " (limit reached: the next pass resumes)"
        if self.error:
            text += f", error: {self.error}"
        return text


@dataclass
class Pass:
    run: ReconciliationRun
    resume: dict = field(default_factory=dict)
    now: object = None

    def found(self, kind: str, obj: str, *, tenant_id=None, inbox_event_id=None, detail=None) -> Finding:
        """The open finding for (kind, obj): opened now, or the one already open (its last_seen refreshed)."""
        self.run.findings += 1
        return open_finding(
            self.run, kind, obj, self.now, tenant_id=tenant_id, inbox_event_id=inbox_event_id, detail=detail
        )

    def repaired(self, finding: Finding, resolution: str, **fields) -> bool:
        if resolve(finding.pk, resolution, self.now, **fields):
            self.run.repaired += 1
            return True
        return False


def open_finding(run, kind: str, obj: str, now, *, tenant_id=None, inbox_event_id=None, detail=None) -> Finding:
    obj = obj[:1200]
    existing = Finding.objects.filter(kind=kind, object=obj, resolved_at__isnull=True).first()
    if existing is None:
        try:
            with transaction.atomic():
                return Finding.objects.create(
                    run=run,
                    kind=kind,
                    object=obj,
                    tenant_id=tenant_id,
                    inbox_event_id=inbox_event_id,
                    detail=detail or {},
                    first_seen=now,
                    last_seen=now,
                )
        except IntegrityError:  # another pass opened it a moment ago
            existing = Finding.objects.get(kind=kind, object=obj, resolved_at__isnull=True)
    changes = {"last_seen": now, **({"detail": detail} if detail is not None else {})}
    Finding.objects.filter(pk=existing.pk).update(**changes)
    for name, value in changes.items():
        setattr(existing, name, value)
    return existing


def resolve(finding_id: int, resolution: str, now, **fields) -> bool:
    """Close an open finding (once: a conditional UPDATE)."""
    return bool(
        Finding.objects.filter(pk=finding_id, resolved_at__isnull=True).update(
            resolved_at=now, resolution=resolution[:200], last_seen=now, **fields
        )
    )


def purge_runs(days: int | None = None) -> int:
    """Delete runs older than MAILROOM_RECONCILE_KEEP_DAYS (30) that recorded no finding (findings keep theirs)."""
    from django.db.models import Exists, OuterRef

    keep = days if days is not None else int(setting("MAILROOM_RECONCILE_KEEP_DAYS", 30))
    old = (
        ReconciliationRun.objects.filter(started_at__lt=timezone.now() - timedelta(days=keep))
        .exclude(Exists(Finding.objects.filter(run=OuterRef("pk"))))
        .values_list("pk", flat=True)[:10000]
    )
    deleted, _ = ReconciliationRun.objects.filter(pk__in=list(old)).delete()
    return deleted


def open_findings(kind: str, **lookups):
    return Finding.objects.filter(kind=kind, resolved_at__isnull=True, **lookups).order_by("pk")


@contextmanager
def recording(kind: str, scope: str, summaries: list, now=None):
    """Record one pass: yields a `Pass`; its counts, cursor and any failure end up in the run row.

    A provider's or destination's failure (`TransientError`, `PermanentError`, `AmbiguousOutcome`)
    ends the pass with `error` set and the cursor where it was; anything else is logged as well.
    """
    now = now or timezone.now()
    previous = (
        ReconciliationRun.objects.filter(kind=kind, scope=scope, finished_at__isnull=False)
        .order_by("-started_at", "-pk")
        .values_list("cursor", flat=True)
        .first()
    )
    run = ReconciliationRun.objects.create(kind=kind, scope=scope, started_at=timezone.now(), cursor={})
    current = Pass(run, dict(previous or {}), now)
    try:
        yield current
    except (TransientError, PermanentError, AmbiguousOutcome) as exc:
        run.error = f"{getattr(exc, 'kind', type(exc).__name__)}: {exc}"[:2000]
        run.cursor = current.resume  # the next pass starts where this one did
        logger.warning("reconcile %s %s failed: %s", kind, scope, run.error)
    except Exception as exc:  # one reconciler's bug must not stop the others
        run.error = f"{type(exc).__name__}: {exc}"[:2000]
        run.cursor = current.resume
        logger.exception("reconcile %s %s failed", kind, scope)
    finally:
        run.finished_at = timezone.now()
        run.save(update_fields=["scanned", "findings", "repaired", "error", "cursor", "finished_at"])
        summaries.append(
            Summary(
                kind, scope, run.scanned, run.findings, run.repaired, run.error, more=bool(run.cursor) and not run.error
            )
        )
        logger.log(logging.WARNING if run.findings or run.error else logging.DEBUG, "%s", summaries[-1].line())


def pass_lock():
    """True when this process now runs the only reconciliation pass; False when another one does."""
    return exclusive(LOCK_NAMESPACE, 0, "reconcile")
