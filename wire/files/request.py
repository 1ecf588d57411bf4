"""What a /v1/files request says: the upload's form (multipart: `file` and `purpose`)
and the list's query (`purpose`, `after`, `limit`, `order`). Bad input is a 400 naming
the field; an upload over PANTHEON_FILES_MAX_BYTES is a 413."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http.multipartparser import MultiPartParserError

from pantheon_platform.errors import ApiError, invalid_request

PURPOSES = ("batch",)  # what an upload may be for (batch outputs are the server's own)
LIST_PURPOSES = ("batch", "batch_output")
FILENAME_MAX = 512
LIST_LIMIT_MAX = 10000


@dataclass(frozen=True)
class Upload:
    file: object  # a Django UploadedFile (on disk past FILE_UPLOAD_MAX_MEMORY_SIZE)
    filename: str
    purpose: str


def parse_upload(request) -> Upload:
    """The multipart form of POST /v1/files (reads the body: call it off the loop)."""
    if not request.content_type.startswith("multipart/form-data"):
        raise invalid_request("send the file as multipart/form-data (fields file, purpose)")
    try:
        form, uploads = request.POST, request.FILES
    except RequestDataTooBig:
        raise ApiError(
            413, "the form's fields (other than the file) are too large", "request_too_large"
        ) from None
    except (MultiPartParserError, SuspiciousOperation, UnicodeDecodeError, ValueError) as exc:
        raise invalid_request(f"the multipart form could not be read: {exc}") from None
    purpose = form.get("purpose")
    if purpose is None:
        raise invalid_request("purpose: this field is required", param="purpose")
    if purpose not in PURPOSES:
        raise invalid_request(
            f"purpose: {purpose!r} is not supported; expected one of {list(PURPOSES)}",
            param="purpose",
        )
    upload = uploads.get("file")
    if upload is None:
        raise invalid_request("file: this field is required (a file part)", param="file")
    if upload.size > settings.PANTHEON_FILES_MAX_BYTES:
        raise ApiError(
            413,
            f"file: {upload.size} bytes, over the {settings.PANTHEON_FILES_MAX_BYTES} an "
            "upload may hold (PANTHEON_FILES_MAX_BYTES)",
            "request_too_large",
        )
    filename = (upload.name or "upload.jsonl")[:FILENAME_MAX]
    return Upload(upload, filename, purpose)


@dataclass(frozen=True)
class Page:
    after: str | None
    limit: int
    order: str  # "desc" (newest first, the default) or "asc"
    purpose: str | None = None


def parse_page(query, default_limit: int, max_limit: int = LIST_LIMIT_MAX) -> Page:
    """A list's cursor query (`after`, `limit`, `order`, and for files `purpose`)."""
    raw_limit = query.get("limit")
    limit = default_limit
    if raw_limit is not None:
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= max_limit:
            raise invalid_request(
                f"limit: expected an integer from 1 to {max_limit}", param="limit"
            )
        limit = int(raw_limit)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid_request("order: expected asc or desc", param="order")
    purpose = query.get("purpose") or None
    if purpose is not None and purpose not in LIST_PURPOSES:
        raise invalid_request(f"purpose: expected one of {list(LIST_PURPOSES)}", param="purpose")
    return Page(query.get("after") or None, limit, order, purpose)
