"""The ORM side of batches: create, find, list and cancel (the views'), and the runner's
durable steps: a line claimed (running), a line done (its output line kept, the counts
moved, in one transaction), lines in flight at a crash made pending again, the end
states. Every function blocks: run them through `db` (wire.files.storage)."""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from wire.batches.models import (
    CANCELLING,
    DONE,
    ENDED,
    FAILED,
    IN_PROGRESS,
    PENDING,
    RUNNING,
    Batch,
    BatchLine,
)
from wire.files import storage as files

WINDOWS = {"24h": timedelta(hours=24)}


def new_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def is_batch_id(value: str) -> bool:
    """An id this server could have made (others are not looked up)."""
    return value.startswith("batch_") and 6 < len(value) <= 64 and value[6:].isalnum()


def create(namespace: str, input_file_id: str, endpoint: str, window: str, metadata) -> Batch:
    return Batch.objects.create(
        id=new_id(),
        namespace=namespace,
        endpoint=endpoint,
        completion_window=window,
        input_file_id=input_file_id,
        metadata=metadata,
        expires_at=timezone.now() + WINDOWS[window],
    )


def find(namespace: str, batch_id: str) -> Batch | None:
    if not is_batch_id(batch_id):
        return None
    return Batch.objects.filter(id=batch_id, namespace=namespace).first()


def listed(namespace: str, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    rows = Batch.objects.filter(namespace=namespace).order_by("-created", "-id")
    if after and (cursor := rows.filter(id=after).first()) is not None:
        rows = rows.filter(created__lte=cursor.created).exclude(id=cursor.id)
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit


def cancel(namespace: str, batch_id: str) -> Batch | None:
    """Ask the runner to stop the caller's batch (cancelling; it ends as cancelled, what
    finished kept). An ended batch stays as it is; None: no such batch."""
    if not is_batch_id(batch_id):
        return None
    with transaction.atomic():
        batch = find(namespace, batch_id)
        if batch is None:
            return None
        if batch.status not in ENDED and batch.status != CANCELLING:
            batch.status, batch.cancelling_at = CANCELLING, timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
    return batch


def cancel_by_operator(batch_ids) -> int:
    """The console's cancel action: every named batch not ended yet is cancelling."""
    return (
        Batch.objects.filter(id__in=list(batch_ids))
        .exclude(status__in=(*ENDED, CANCELLING))
        .update(status=CANCELLING, cancelling_at=timezone.now())
    )


# --- the runner's steps ---------------------------------------------------------------------


def active() -> list[Batch]:
    """Batches the runner has work on, oldest first."""
    return list(Batch.objects.exclude(status__in=ENDED).order_by("created", "id"))


def recover() -> int:
    """Lines that were in flight when the last runner stopped (a crash, a SIGKILL) are
    pending again: they are redone; lines done are never run again."""
    return BatchLine.objects.filter(state=RUNNING).update(state=PENDING)


def claim(batch_id: str, n: int) -> list[tuple[int, str, str, dict]]:
    """Up to `n` pending lines of the batch, marked running, in input order:
    (row id, url, custom_id, body)."""
    with transaction.atomic():
        rows = list(
            BatchLine.objects.filter(batch_id=batch_id, state=PENDING)
            .order_by("index")
            .values_list("id", "url", "custom_id", "body")[:n]
        )
        BatchLine.objects.filter(id__in=[r[0] for r in rows]).update(state=RUNNING)
    return rows


def unclaim(line_ids) -> None:
    """Lines stopped before they finished (a cancel): pending again."""
    BatchLine.objects.filter(id__in=list(line_ids), state=RUNNING).update(state=PENDING)


def finish_line(batch_id: str, line_id: int, ok: bool, result: dict) -> bool:
    """A line's output kept and counted, once: False (nothing changed) when it is not
    running any more (the batch was cancelled or expired meanwhile)."""
    with transaction.atomic():
        moved = BatchLine.objects.filter(id=line_id, state=RUNNING).update(
            state=DONE, ok=ok, result=result
        )
        if moved:
            counts = {"completed": F("completed") + 1} if ok else {"failed": F("failed") + 1}
            Batch.objects.filter(id=batch_id).update(**counts)
    return bool(moved)


def done_lines(batch_id: str, ok: bool) -> list[dict]:
    """The batch's output (ok) or error lines so far, in input order."""
    rows = BatchLine.objects.filter(batch_id=batch_id, state=DONE, ok=ok).order_by("index")
    return [result for result in rows.values_list("result", flat=True).iterator()]


def pending_count(batch_id: str) -> int:
    return BatchLine.objects.filter(batch_id=batch_id).exclude(state=DONE).count()


def fail_pending(batch_id: str, code: str, message: str) -> list[dict]:
    """Every line not done (an expired batch's) is done as an error line; those lines."""
    lines = []
    with transaction.atomic():
        rows = BatchLine.objects.filter(batch_id=batch_id).exclude(state=DONE).order_by("index")
        for line in rows:
            line.state, line.ok = DONE, False
            line.result = error_line(line.custom_id, code, message)
            line.save(update_fields=["state", "ok", "result"])
            lines.append(line.result)
        Batch.objects.filter(id=batch_id).update(failed=F("failed") + len(lines))
    return lines


def error_line(custom_id: str, code: str, message: str) -> dict:
    return {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def set_status(batch_id: str, status: str, **fields) -> None:
    stamp = {
        "in_progress": "in_progress_at",
        "finalizing": "finalizing_at",
        "completed": "completed_at",
        "failed": "failed_at",
        "expired": "expired_at",
        "cancelled": "cancelled_at",
    }.get(status)
    if stamp:
        fields[stamp] = timezone.now()
    Batch.objects.filter(id=batch_id).update(status=status, **fields)


def fail(batch_id: str, errors: list[dict]) -> None:
    set_status(batch_id, FAILED, errors=errors)


def start(batch_id: str, namespace: str, lines: list[BatchLine]) -> None:
    """A valid input: its lines stored, the output and error files made, in_progress."""
    with transaction.atomic():
        BatchLine.objects.bulk_create(lines, batch_size=500)
        output = files.create_output(namespace, f"{batch_id}_output.jsonl")
        error = files.create_output(namespace, f"{batch_id}_error.jsonl")
        set_status(
            batch_id,
            IN_PROGRESS,
            total=len(lines),
            output_file_id=output.id,
            error_file_id=error.id,
        )


def drop_empty_outputs(batch: Batch) -> None:
    """An output or error file with no line is not kept (OpenAI's null id)."""
    for field in ("output_file_id", "error_file_id"):
        file_id = getattr(batch, field)
        if file_id is None:
            continue
        ok = field == "output_file_id"
        if not BatchLine.objects.filter(batch_id=batch.id, state=DONE, ok=ok).exists():
            files.delete(batch.namespace, file_id)
            Batch.objects.filter(id=batch.id).update(**{field: None})
        else:
            files.seal(file_id)
