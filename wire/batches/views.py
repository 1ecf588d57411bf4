"""OpenAI Batches API: POST and GET /v1/batches, GET /v1/batches/{id}, POST
/v1/batches/{id}/cancel. A batch belongs to the key that created it (its namespace): to
any other key it does not exist (404), and its input file must be that key's too. The
work is the runner's (wire/batches/runner.py): a view only records and reads."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from pantheon_platform import tenancy
from pantheon_platform.errors import ApiError, invalid_request, json_response
from pantheon_platform.strict_json import parse_json_object
from wire.batches import runner, store
from wire.batches.render import batch_object
from wire.batches.request import parse_request
from wire.files import storage as files
from wire.files.render import list_object
from wire.files.request import parse_page
from wire.route import api_route


def not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No such Batch object: {batch_id}", "invalid_request_error")


@api_route(("GET", "POST"), "batches failed")
async def batches(request: HttpRequest) -> HttpResponse:
    """POST: a new batch (validating). GET: the caller's batches, newest first."""
    namespace = tenancy.namespace(request)
    if request.method == "GET":
        page = parse_page(request.GET, default_limit=20, max_limit=100)
        rows, more = await files.db(store.listed, namespace, page.after, page.limit)
        return json_response(list_object([batch_object(b) for b in rows], more))
    req = parse_request(parse_json_object(request.body))
    source = await files.db(files.find, namespace, req.input_file_id)
    if source is None:
        raise ApiError(
            404,
            f"No such File object: {req.input_file_id}",
            "invalid_request_error",
            extra={"param": "input_file_id"},
        )
    if source.purpose != "batch":
        raise invalid_request(
            f"input_file_id: the file's purpose is {source.purpose!r}, not 'batch'",
            param="input_file_id",
        )
    batch = await files.db(
        store.create, namespace, source.id, req.endpoint, req.completion_window, req.metadata
    )
    runner.wake()
    return json_response(batch_object(batch))


@api_route(("GET",), "batch failed")
async def batch_detail(request: HttpRequest, batch_id: str) -> HttpResponse:
    batch = None
    if store.is_batch_id(batch_id):
        batch = await files.db(store.find, tenancy.namespace(request), batch_id)
    if batch is None:
        raise not_found(batch_id)
    return json_response(batch_object(batch))


@api_route(("POST",), "batch cancel failed")
async def cancel_batch(request: HttpRequest, batch_id: str) -> HttpResponse:
    """The batch cancelling (the runner stops its lines and ends it as cancelled)."""
    batch = None
    if store.is_batch_id(batch_id):
        batch = await files.db(store.cancel, tenancy.namespace(request), batch_id)
    if batch is None:
        raise not_found(batch_id)
    runner.wake()
    return json_response(batch_object(batch))
