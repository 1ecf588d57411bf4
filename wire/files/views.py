"""OpenAI Files API: POST and GET /v1/files, GET and DELETE /v1/files/{id}, GET
/v1/files/{id}/content. A file belongs to the key that uploaded it (its namespace,
pantheon_platform.tenancy): to any other key it does not exist (404)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from pantheon_platform import tenancy
from pantheon_platform.errors import ApiError, json_response
from wire.files import storage
from wire.files.render import deleted_object, file_object, list_object
from wire.files.request import parse_page, parse_upload
from wire.route import api_route


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", "invalid_request_error")


async def owned(request: HttpRequest, file_id: str):
    """The caller's file `file_id`, or 404."""
    stored = None
    if storage.is_file_id(file_id):
        stored = await storage.db(storage.find, tenancy.namespace(request), file_id)
    if stored is None:
        raise not_found(file_id)
    return stored


@api_route(("GET", "POST"), "files failed")
async def files(request: HttpRequest) -> HttpResponse:
    """POST: upload (multipart `file` + `purpose`). GET: the caller's files."""
    namespace = tenancy.namespace(request)
    if request.method == "POST":

        def upload():
            form = parse_upload(request)
            return storage.save_upload(namespace, form.file, form.filename, form.purpose)

        return json_response(file_object(await storage.db(upload)))
    page = parse_page(request.GET, default_limit=10000)
    rows, more = await storage.db(
        storage.listed, namespace, page.purpose, page.after, page.limit, page.order
    )
    return json_response(list_object([file_object(r) for r in rows], more))


@api_route(("GET", "DELETE"), "file failed")
async def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    """GET: the file object. DELETE: the file gone (row and bytes)."""
    if request.method == "GET":
        return json_response(file_object(await owned(request, file_id)))
    if not storage.is_file_id(file_id) or not await storage.db(
        storage.delete, tenancy.namespace(request), file_id
    ):
        raise not_found(file_id)
    return json_response(deleted_object(file_id))


@api_route(("GET",), "file content failed")
async def file_content(request: HttpRequest, file_id: str) -> HttpResponse:
    """The file's bytes, streamed from disk."""
    stored = await owned(request, file_id)
    response = StreamingHttpResponse(
        _chunks(storage.path_of(stored.id)), content_type="application/octet-stream"
    )
    response["Content-Disposition"] = f'attachment; filename="{stored.id}.jsonl"'
    return response


async def _chunks(path) -> AsyncIterator[bytes]:
    """The file in chunks, each read off the event loop."""
    with path.open("rb") as source:
        while chunk := await asyncio.to_thread(source.read, storage.COPY_CHUNK):
            yield chunk
