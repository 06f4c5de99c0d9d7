"""An event's stored message read a MiB at a time: the worker's one copy of a large message.

Loading `InboxEvent.raw` with the row costs about six times the message at its peak on PostgreSQL: the
bytea arrives as hex text (twice its size) in libpq's buffer and result, is unescaped, then copied into
Python bytes. `raw_message` reads it in `CHUNK_BYTES` slices into one growing buffer that becomes the
bytes without another copy (`io.BytesIO.getvalue`), so the peak is the message and one slice. A load
that defers `raw` (`with_small_raw`) and then calls `load_raw` changes nothing else.
"""

from __future__ import annotations

import io

from django.conf import settings
from django.db.models import BinaryField, Case, F, QuerySet, Value, When
from django.db.models.functions import Length, Substr

from .models import InboxEvent

CHUNK_BYTES = 1 << 20


def raw_message(event_id: int) -> bytes | None:
    """The stored message of event `event_id` (None when it has none, or no longer has one)."""
    rows = InboxEvent.objects.filter(pk=event_id)
    size = rows.annotate(raw_length=Length("raw")).values_list("raw_length", flat=True).first()
    if size is None:
        return None
    buffer = io.BytesIO()
    for start in range(0, size, CHUNK_BYTES):
        piece = (
            rows.annotate(raw_piece=Substr("raw", start + 1, CHUNK_BYTES, output_field=BinaryField()))
            .values_list("raw_piece", flat=True)
            .first()
        )
        if piece is None or len(piece) != min(CHUNK_BYTES, size - start):
            # Purged (retention) while it was read: what the row holds now, in one piece.
            return rows.values_list("raw", flat=True).first()
        buffer.write(piece)
        del piece
    return buffer.getvalue()


def with_small_raw(events: QuerySet) -> QuerySet:
    """`events` with `raw` deferred, and loaded in the same query (as `small_raw`) where the message is no
    larger than `MAILROOM_SPOOL_THRESHOLD_BYTES`: most mail costs no second statement, a large message is
    read by `raw_message` (`load_raw`)."""
    return events.defer("raw").annotate(
        small_raw=Case(
            When(size__lte=settings.MAILROOM_SPOOL_THRESHOLD_BYTES, then=F("raw")),
            default=Value(None, output_field=BinaryField()),
            output_field=BinaryField(),
        )
    )


def load_raw(event: InboxEvent) -> None:
    """Put `event.raw` in place after a `with_small_raw` load (or any load that deferred it)."""
    if "raw" not in event.get_deferred_fields():
        return
    small = getattr(event, "small_raw", None)
    event.raw = bytes(small) if small is not None else raw_message(event.pk)
