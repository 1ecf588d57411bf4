"""OpenAI's batch object: `{"id": "batch_…", "object": "batch", "endpoint", "status",
"request_counts": {"total", "completed", "failed"}, "output_file_id", ...}`."""

from __future__ import annotations

from wire.batches.models import Batch


def _epoch(when) -> int | None:
    return int(when.timestamp()) if when is not None else None


def batch_object(batch: Batch) -> dict:
    errors = None
    if batch.errors:
        errors = {"object": "list", "data": batch.errors}
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _epoch(batch.created),
        "in_progress_at": _epoch(batch.in_progress_at),
        "expires_at": _epoch(batch.expires_at),
        "finalizing_at": _epoch(batch.finalizing_at),
        "completed_at": _epoch(batch.completed_at),
        "failed_at": _epoch(batch.failed_at),
        "expired_at": _epoch(batch.expired_at),
        "cancelling_at": _epoch(batch.cancelling_at),
        "cancelled_at": _epoch(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata,
    }
