"""What /admin/stats and the console report about batches: how many are in each status,
and the lines of the unfinished ones by state."""

from __future__ import annotations

from django.db.models import Count

from wire.batches.models import ENDED, Batch, BatchLine


def stats() -> dict:
    by_status = Batch.objects.values("status").annotate(n=Count("id")).order_by("status")
    lines = (
        BatchLine.objects.exclude(batch__status__in=ENDED)
        .values("state")
        .annotate(n=Count("id"))
        .order_by("state")
    )
    return {
        "batches": {row["status"]: row["n"] for row in by_status},
        "open_lines": {row["state"]: row["n"] for row in lines},
    }


def percent_done(batch: Batch) -> int:
    return round(100 * batch.done / batch.total) if batch.total else 0
