"""The OpenAPI pieces of the session routes (/admin/session/export, /session/restore,
/session/release, /session/estimate, and /session/watch, the Channels consumer). These
views parse their JSON by hand; the bounds are their constants (sessions/views.py).
pantheon_site/openapi.py puts the document together."""

from __future__ import annotations

from pantheon_platform.openapi import (
    BOOL,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    nullable,
    obj,
    ok,
    operation,
    query,
    session_header,
    sse_event,
)
from pantheon_platform.tenancy import SESSION_ID_MAX
from sessions.views import ESTIMATE_MAX, TOKEN_ID_LIMIT

_SESSION_ID = {"type": "string", "maxLength": SESSION_ID_MAX}
_MODEL_NAME = {"type": "string", "maxLength": SESSION_ID_MAX}
_SESSION_BODY = {
    "name": nullable({**_MODEL_NAME, "description": "The model; absent: the default."}),
    "session_id": _SESSION_ID,
}


def add_paths(paths: dict[str, dict]) -> None:
    paths.update(
        {
            "/admin/session/export": {
                "post": operation(
                    "/admin/session/export",
                    "exportSession",
                    "A session's most recent conversation as a base64 blob plus its tokens",
                    ok(
                        obj(
                            {
                                "session_id": STRING,
                                "namespace": {
                                    "type": "string",
                                    "description": "Whose session: its API key's namespace.",
                                },
                                "weights_version": {
                                    "type": "string",
                                    "description": "Hash of the weights.",
                                },
                                "n_tok": NON_NEGATIVE,
                                "blob_bytes": NON_NEGATIVE,
                                "blob_b64": STRING,
                                "tokens": {"type": "array", "items": NON_NEGATIVE},
                            },
                            (
                                "session_id",
                                "weights_version",
                                "n_tok",
                                "blob_bytes",
                                "blob_b64",
                                "tokens",
                            ),
                        )
                    ),
                    (400, 404, 429, 503),
                    body=obj(
                        {
                            **_SESSION_BODY,
                            "namespace": {
                                "type": "string",
                                "minLength": 1,
                                "description": "Whose session, when several API keys hold the id.",
                            },
                        },
                        ("session_id",),
                        additionalProperties=True,
                    ),
                    tag="sessions",
                )
            },
            "/session/restore": {
                "post": operation(
                    "/session/restore",
                    "restoreSession",
                    "Install an exported conversation",
                    ok(
                        obj(
                            {
                                "restored": {"const": True},
                                "session_id": STRING,
                                "n_tok": NON_NEGATIVE,
                            },
                            ("restored", "session_id", "n_tok"),
                        )
                    ),
                    (400, 404, 409, 429, 503),
                    body=obj(
                        {
                            **_SESSION_BODY,
                            "blob": {"type": "string", "description": "blob_b64 of an export"},
                            "tokens": {
                                "type": "array",
                                "items": {
                                    "type": "integer",
                                    "minimum": 0,
                                    "maximum": TOKEN_ID_LIMIT - 1,
                                },
                            },
                        },
                        ("blob", "tokens"),
                        additionalProperties=True,
                        description="session_id here or in X-Session-Id.",
                    ),
                    parameters=[session_header()],
                    tag="sessions",
                )
            },
            "/session/release": {
                "post": operation(
                    "/session/release",
                    "releaseSession",
                    "Free every conversation of a session id now (idempotent)",
                    ok(
                        obj(
                            {"released": {"const": True}, "session_id": STRING},
                            ("released", "session_id"),
                        )
                    ),
                    (400, 404, 503),
                    body=obj(
                        _SESSION_BODY,
                        additionalProperties=True,
                        description="session_id here or in X-Session-Id.",
                    ),
                    parameters=[session_header()],
                    tag="sessions",
                )
            },
            "/session/estimate": {
                "get": operation(
                    "/session/estimate",
                    "estimateSession",
                    "Restoring from a blob vs re-prefilling, by arithmetic",
                    ok(
                        obj(
                            {
                                "model": STRING,
                                "tokens": {"type": "integer", "minimum": 1},
                                "prefill_tok_per_s": NUMBER,
                                "cold_reprefill_s": NUMBER,
                                "warm_restore_s": NUMBER,
                                "blob_bytes_est": NON_NEGATIVE,
                                "prefill_rate_measured": BOOL,
                            },
                            (
                                "model",
                                "tokens",
                                "prefill_tok_per_s",
                                "cold_reprefill_s",
                                "warm_restore_s",
                                "blob_bytes_est",
                                "prefill_rate_measured",
                            ),
                        )
                    ),
                    (400,),
                    parameters=[
                        query(
                            "tokens",
                            {"type": "integer", "minimum": 1, "maximum": ESTIMATE_MAX},
                            required=True,
                        ),
                        query("name", _MODEL_NAME, description='Unknown: model is "".'),
                        query(
                            "blob_bytes", {"type": "integer", "minimum": 1, "maximum": ESTIMATE_MAX}
                        ),
                        query(
                            "upload_bps",
                            {"type": "number", "exclusiveMinimum": 0},
                            description="Bytes/s; default 12.5e6.",
                        ),
                    ],
                    tag="sessions",
                )
            },
            "/session/watch": {
                "get": operation(
                    "/session/watch",
                    "watchSession",
                    "Hold a session alive while connected (a long-held event stream)",
                    {
                        "description": "`: watch established`, then `: keepalive` comments "
                        "until the client goes.",
                        "content": {SSE: {"schema": sse_event("Comment lines only: no event.")}},
                    },
                    (400, 404, 503),
                    parameters=[
                        query(
                            "session_id",
                            {"type": "string", "maxLength": SESSION_ID_MAX},
                            description="Or X-Session-Id.",
                        ),
                        query("name", STRING),
                        session_header(),
                    ],
                    tag="sessions",
                )
            },
        }
    )


def schemas() -> dict:
    return {}  # the session routes' bodies are written inline
