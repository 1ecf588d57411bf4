"""OpenAI's file objects: `{"object": "file", "id": "file-…", "bytes", "created_at",
"filename", "purpose", "status": "processed"}`, lists and deletions."""

from __future__ import annotations

from wire.files.models import StoredFile


def file_object(stored: StoredFile) -> dict:
    return {
        "id": stored.id,
        "object": "file",
        "bytes": stored.bytes,
        "created_at": int(stored.created.timestamp()),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def list_object(items: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def deleted_object(file_id: str) -> dict:
    return {"id": file_id, "object": "file", "deleted": True}
