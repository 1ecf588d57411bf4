"""The OpenAPI pieces of the Files routes (wire.files): /v1/files, /v1/files/{file_id},
/v1/files/{file_id}/content. pantheon_site/openapi.py calls add_paths() and merges
schemas()."""

from __future__ import annotations

from pantheon_platform.openapi import NON_NEGATIVE, STRING, obj, ok, operation, query, ref

FILES_PATH = "/v1/files"
FILE_PATH = "/v1/files/{file_id}"
CONTENT_PATH = "/v1/files/{file_id}/content"
FILE_ID = {
    "name": "file_id",
    "in": "path",
    "required": True,
    "description": "A file's id (file-...), uploaded with the caller's key.",
    "schema": {"type": "string", "minLength": 1},
}


def schemas() -> dict:
    file = obj(
        {
            "id": STRING,
            "object": {"const": "file"},
            "bytes": NON_NEGATIVE,
            "created_at": NON_NEGATIVE,
            "filename": STRING,
            "purpose": {"enum": ["batch", "batch_output"]},
            "status": {"const": "processed"},
        },
        ("id", "object", "bytes", "created_at", "filename", "purpose", "status"),
    )
    return {
        "File": file,
        "FileList": obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": ref("File")}},
            ("object", "data"),
        ),
        "FileDeleted": obj(
            {"id": STRING, "object": {"const": "file"}, "deleted": {"const": True}},
            ("id", "object", "deleted"),
        ),
    }


def add_paths(paths: dict[str, dict]) -> None:
    upload = operation(
        FILES_PATH,
        "createFile",
        "Upload a file (multipart/form-data: `file`, `purpose` batch), streamed to disk; "
        "at most PANTHEON_FILES_MAX_BYTES, within the key's PANTHEON_FILES_QUOTA_BYTES",
        ok(ref("File")),
        (400, 413),
        tag="client",
    )
    upload["requestBody"] = {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": obj(
                    {"file": {"type": "string", "format": "binary"}, "purpose": STRING},
                    ("file", "purpose"),
                )
            }
        },
    }
    paths[FILES_PATH] = {
        "get": operation(
            FILES_PATH,
            "listFiles",
            "The caller's files, newest first",
            ok(ref("FileList")),
            (400,),
            parameters=[
                query("purpose", STRING),
                query("after", STRING),
                query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}),
                query("order", {"enum": ["asc", "desc"]}),
            ],
            tag="client",
        ),
        "post": upload,
    }
    paths[FILE_PATH] = {
        "parameters": [FILE_ID],
        "get": operation(
            FILE_PATH,
            "retrieveFile",
            "A file (404: another key's)",
            ok(ref("File")),
            (404,),
            tag="client",
        ),
        "delete": operation(
            FILE_PATH,
            "deleteFile",
            "Delete a file (404: another key's)",
            ok(ref("FileDeleted")),
            (404,),
            tag="client",
        ),
    }
    content = operation(
        CONTENT_PATH,
        "downloadFile",
        "A file's bytes (404: another key's)",
        ok({}),
        (404,),
        tag="client",
    )
    content["responses"]["200"] = {
        "description": "The file's bytes.",
        "content": {"application/octet-stream": {"schema": {"type": "string"}}},
    }
    paths[CONTENT_PATH] = {"parameters": [FILE_ID], "get": content}
