"""A batch's input checked up front, before any line runs: every line one JSON object
`{"custom_id", "method": "POST", "url", "body": {...}}`, its url one of the batch
endpoints (usually the batch's own; unlike OpenAI, one batch may mix chat and embeddings
lines, each run at its own url), no custom_id twice, every model one this server serves. Any of these wrong and the batch
fails with its `errors` (OpenAI's {code, message, param, line}); a body the endpoint
itself refuses is not checked here: that line runs, and its 400 is an error line."""

from __future__ import annotations

import json

from django.conf import settings

from pantheon_platform.runtime import ModelNotFound, NoModelsLoaded, get_runtime
from wire.batches import store
from wire.batches.models import Batch, BatchLine
from wire.batches.request import ENDPOINTS
from wire.files import storage as files

MAX_ERRORS = 100  # a batch's `errors` list at most (the first ones)
CUSTOM_ID_MAX = 512


def validate(batch: Batch) -> None:
    """Read the input file; in_progress with its lines stored, or failed with errors."""
    source = files.find(batch.namespace, batch.input_file_id)
    if source is None:
        store.fail(batch.id, [_error("file_not_found", "the input file no longer exists")])
        return
    errors: list[dict] = []
    lines: list[BatchLine] = []
    seen: set[str] = set()
    models: dict[str, int] = {}
    with open(files.path_of(source.id), "rb") as text:
        for number, raw in enumerate(text, start=1):
            if not raw.strip():
                continue
            if len(lines) >= settings.PANTHEON_BATCH_MAX_LINES:
                errors.append(
                    _error(
                        "too_many_lines",
                        f"the input holds more than {settings.PANTHEON_BATCH_MAX_LINES} "
                        "lines (PANTHEON_BATCH_MAX_LINES)",
                        line=number,
                    )
                )
                break
            line, problem = _parse(raw)
            if problem is None and line["custom_id"] in seen:
                problem = _error(
                    "duplicate_custom_id",
                    f"custom_id {line['custom_id']!r} appears more than once",
                    "custom_id",
                )
            if problem is not None:
                problem["line"] = number
                errors.append(problem)
                if len(errors) >= MAX_ERRORS:
                    break
                continue
            seen.add(line["custom_id"])
            model = line["body"].get("model")
            if isinstance(model, str):
                models.setdefault(model, number)
            lines.append(
                BatchLine(
                    batch_id=batch.id,
                    index=len(lines),
                    custom_id=line["custom_id"],
                    url=line["url"],
                    body=line["body"],
                )
            )
    if not errors:
        errors = _model_errors(models)
    if not errors and not lines:
        errors = [_error("empty_file", "the input file holds no request line")]
    if errors:
        store.fail(batch.id, errors[:MAX_ERRORS])
        return
    store.start(batch.id, batch.namespace, lines)


def _parse(raw: bytes) -> tuple[dict, dict | None]:
    """One input line, or the error that fails the batch."""
    try:
        line = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return {}, _error("invalid_json_line", "the line is not valid JSON")
    if not isinstance(line, dict):
        return {}, _error("invalid_json_line", "the line is not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= CUSTOM_ID_MAX:
        message = f"custom_id: expected a string of 1 to {CUSTOM_ID_MAX} characters"
        return {}, _error("missing_required_parameter", message, "custom_id")
    if line.get("method") != "POST":
        return {}, _error("invalid_method", "method: expected POST", "method")
    if line.get("url") not in ENDPOINTS:
        message = f"url: {line.get('url')!r} is not a batch endpoint ({', '.join(ENDPOINTS)})"
        return {}, _error("invalid_url", message, "url")
    if not isinstance(line.get("body"), dict):
        return {}, _error("invalid_request", "body: expected a JSON object", "body")
    return line, None


def _model_errors(models: dict[str, int]) -> list[dict]:
    """Each model named that no loaded model answers to (its first line)."""
    errors = []
    for model, number in models.items():
        try:
            get_runtime().resolve(model)
        except (ModelNotFound, NoModelsLoaded) as exc:
            errors.append(_error("model_not_found", str(exc), "body.model", line=number))
    return errors


def _error(code: str, message: str, param: str | None = None, line: int | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}
