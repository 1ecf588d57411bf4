"""The OpenAPI pieces of the Batches routes (wire.batches): /v1/batches,
/v1/batches/{batch_id}, /v1/batches/{batch_id}/cancel."""

from __future__ import annotations

from pantheon_platform.openapi import NON_NEGATIVE, STRING, nullable, obj, ok, operation, query, ref
from wire.batches.models import STATUSES
from wire.batches.request import ENDPOINTS

BATCHES_PATH = "/v1/batches"
BATCH_PATH = "/v1/batches/{batch_id}"
CANCEL_PATH = "/v1/batches/{batch_id}/cancel"
BATCH_ID = {
    "name": "batch_id",
    "in": "path",
    "required": True,
    "description": "A batch's id (batch_...), made with the caller's key.",
    "schema": {"type": "string", "minLength": 1},
}


def schemas() -> dict:
    counts = obj(
        {"total": NON_NEGATIVE, "completed": NON_NEGATIVE, "failed": NON_NEGATIVE},
        ("total", "completed", "failed"),
    )
    batch = obj(
        {
            "id": STRING,
            "object": {"const": "batch"},
            "endpoint": {"enum": list(ENDPOINTS)},
            "status": {"enum": list(STATUSES)},
            "input_file_id": STRING,
            "output_file_id": nullable(STRING),
            "error_file_id": nullable(STRING),
            "completion_window": STRING,
            "created_at": NON_NEGATIVE,
            "request_counts": counts,
            "errors": {"type": ["object", "null"]},
            "metadata": {"type": ["object", "null"]},
        },
        ("id", "object", "endpoint", "status", "input_file_id", "request_counts"),
    )
    request = obj(
        {
            "input_file_id": STRING,
            "endpoint": {"enum": list(ENDPOINTS)},
            "completion_window": {"const": "24h"},
            "metadata": {"type": ["object", "null"]},
        },
        ("input_file_id", "endpoint", "completion_window"),
        additionalProperties=False,
    )
    return {
        "Batch": batch,
        "BatchRequest": request,
        "BatchList": obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Batch")}},
            ("object", "data"),
        ),
    }


def add_paths(paths: dict[str, dict]) -> None:
    paths[BATCHES_PATH] = {
        "get": operation(
            BATCHES_PATH,
            "listBatches",
            "The caller's batches, newest first",
            ok(ref("BatchList")),
            (400,),
            parameters=[
                query("after", STRING),
                query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
            ],
            tag="client",
        ),
        "post": operation(
            BATCHES_PATH,
            "createBatch",
            "A batch of the input file's lines (validating; the runner takes it on in the "
            "`batch` priority class)",
            ok(ref("Batch")),
            (400, 404),
            body=ref("BatchRequest"),
            tag="client",
        ),
    }
    paths[BATCH_PATH] = {
        "parameters": [BATCH_ID],
        "get": operation(
            BATCH_PATH,
            "retrieveBatch",
            "A batch (404: another key's)",
            ok(ref("Batch")),
            (404,),
            tag="client",
        ),
    }
    paths[CANCEL_PATH] = {
        "parameters": [BATCH_ID],
        "post": operation(
            CANCEL_PATH,
            "cancelBatch",
            "Cancel a batch: its lines stop within a step, what finished is kept",
            ok(ref("Batch")),
            (404,),
            tag="client",
        ),
    }
