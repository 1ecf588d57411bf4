"""Files on disk and their rows: the ORM and file-system side of /v1/files.

An upload is copied chunk by chunk (never whole in memory) into a temporary file beside
its final place, hashed as it goes, then renamed into place and recorded; a failure
leaves neither. A key's files (uploads and batch outputs) may hold at most
PANTHEON_FILES_QUOTA_BYTES in all. Batch outputs grow as their lines finish (`append`)
and are sealed (bytes and sha256 recorded) when the batch ends.

Every function here blocks (disk and ORM): the views run them through `db`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.db.models import Sum

from pantheon_platform.db_thread import on_db_thread
from pantheon_platform.errors import ApiError
from wire.files.models import StoredFile

COPY_CHUNK = 1 << 20


# ORM work on a worker thread, retried while SQLite reports a lock (the batch runner's
# thread writes beside the routes): pantheon_platform/db_thread.py.
db = on_db_thread


def new_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def is_file_id(value: str) -> bool:
    return value.startswith("file-") and 5 < len(value) <= 64 and value[5:].isalnum()


def folder() -> Path:
    path = Path(settings.PANTHEON_FILES_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def path_of(file_id: str) -> Path:
    return folder() / file_id


def used_bytes(namespace: str) -> int:
    return StoredFile.objects.filter(namespace=namespace).aggregate(n=Sum("bytes"))["n"] or 0


def check_quota(namespace: str, more: int) -> None:
    """ApiError 400 when `more` bytes would take the key past its quota."""
    quota = settings.PANTHEON_FILES_QUOTA_BYTES
    used = used_bytes(namespace)
    if used + more > quota:
        raise ApiError(
            400,
            f"this key's files would hold {used + more} bytes, over its quota of {quota} "
            "(PANTHEON_FILES_QUOTA_BYTES); delete some files first",
            "invalid_request_error",
            extra={"code": "file_quota_exceeded"},
        )


def save_upload(namespace: str, upload, filename: str, purpose: str) -> StoredFile:
    """Copy a Django UploadedFile to disk (chunked, hashed) and record it."""
    check_quota(namespace, upload.size or 0)
    file_id = new_id()
    final = path_of(file_id)
    tmp = final.with_name(f".{file_id}.part")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for chunk in upload.chunks(COPY_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
        return StoredFile.objects.create(
            id=file_id,
            namespace=namespace,
            filename=filename,
            purpose=purpose,
            bytes=size,
            sha256=digest.hexdigest(),
        )
    except BaseException:
        tmp.unlink(missing_ok=True)
        final.unlink(missing_ok=True)
        raise


def find(namespace: str, file_id: str) -> StoredFile | None:
    """The key's file, or None (none, another key's, or its bytes gone from disk)."""
    if not is_file_id(file_id):
        return None
    stored = StoredFile.objects.filter(id=file_id, namespace=namespace).first()
    if stored is None or not path_of(stored.id).exists():
        return None
    return stored


def listed(namespace: str, purpose: str | None, after: str | None, limit: int, order: str):
    """(a page of the key's files, whether more follow)."""
    rows = StoredFile.objects.filter(namespace=namespace)
    if purpose:
        rows = rows.filter(purpose=purpose)
    newest_first = order != "asc"
    rows = rows.order_by(*(("-created", "-id") if newest_first else ("created", "id")))
    if after:
        cursor = rows.filter(id=after).first()
        if cursor is not None:
            if newest_first:
                rows = rows.filter(created__lte=cursor.created).exclude(id=cursor.id)
            else:
                rows = rows.filter(created__gte=cursor.created).exclude(id=cursor.id)
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit


def delete(namespace: str, file_id: str) -> bool:
    stored = find(namespace, file_id)
    if stored is None:
        return False
    stored.delete()
    path_of(file_id).unlink(missing_ok=True)
    return True


# --- batch outputs -----------------------------------------------------------------------


def create_output(namespace: str, filename: str) -> StoredFile:
    """An empty output file (purpose batch_output) the runner appends to."""
    file_id = new_id()
    path_of(file_id).write_bytes(b"")
    return StoredFile.objects.create(
        id=file_id, namespace=namespace, filename=filename, purpose="batch_output"
    )


def rewrite(file_id: str, lines: list[bytes]) -> None:
    """Replace an output file's bytes with `lines` (a resumed batch: what the database
    says finished, so nothing appended before a crash is there twice)."""
    tmp = path_of(file_id).with_name(f".{file_id}.part")
    with open(tmp, "wb") as out:
        out.writelines(lines)
    os.replace(tmp, path_of(file_id))


def append(file_id: str, line: bytes) -> None:
    with open(path_of(file_id), "ab") as out:
        out.write(line)


def seal(file_id: str) -> None:
    """Record an output file's final size and hash."""
    digest, size = hashlib.sha256(), 0
    with open(path_of(file_id), "rb") as src:
        while chunk := src.read(COPY_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    StoredFile.objects.filter(id=file_id).update(bytes=size, sha256=digest.hexdigest())
