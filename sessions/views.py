"""Session routes: POST /admin/session/export, POST /session/restore, POST /session/release,
GET /session/estimate. (GET /session/watch is a Channels consumer: consumers.py.)

Sync views on purpose: an export encodes, hashes and base64-encodes every KV byte of a
conversation and a restore decodes and checks them (hundreds of MB for a long session);
under ASGI Django runs each sync request in its own thread, off the event loop that
streams completions. Validate, call the model's service, render.

Each key's sessions are its own (pantheon_platform/tenancy.py): restore, release and watch reach
only the caller's namespace. An export (an operator route: the session_export scope)
may take any key's session, and says whose.
"""

from __future__ import annotations

import base64
import functools
import logging
import math
import re
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import FALLBACK_PREFILL_TOK_PER_S, BadSessionBlob, SessionKey
from pantheon_platform import tenancy
from pantheon_platform.errors import (
    ApiError,
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
)
from pantheon_platform.json_blob import (
    REST_MAX_BYTES,
    Base64Sink,
    BodyTooLarge,
    split_field,
)
from pantheon_platform.request_log import note
from pantheon_platform.routes import restore_body_limit
from pantheon_platform.runtime import ModelNotFound, NoModelsLoaded, get_runtime
from pantheon_platform.strict_json import parse_json_object
from pantheon_platform.tenancy import SESSION_ID_MAX
from sessions.export import export_body

log = logging.getLogger("pantheon.http")

TOKEN_ID_LIMIT = 1 << 31  # token ids are 0 <= t < 2**31 (the blob format's bound)
ESTIMATE_BYTES_PER_TOKEN = 16 * 1024  # the contract's blob estimate for an unknown model
ESTIMATE_UPLOAD_BPS = 12.5e6  # the contract's assumed upload rate, bytes/s
ESTIMATE_MAX = (1 << 63) - 1  # bound on `tokens` and `blob_bytes` (keeps the floats finite)


def _route(*methods: str) -> Callable:
    """A JSON route: other methods get 405; every exception leaves as the error shape
    (an unexpected one as a bare 500, its traceback in the log only)."""

    def wrap(view: Callable[[HttpRequest], HttpResponse]) -> Callable:
        @csrf_exempt
        @functools.wraps(view)
        def route(request: HttpRequest) -> HttpResponse:
            if request.method not in methods:
                allowed = [*methods, "OPTIONS"]
                return method_not_allowed(request.method or "", allowed).response()
            try:
                return view(request)
            except Exception as exc:
                error = api_error_from(exc)
                if error.status == 500:
                    log.error("%s %s failed", request.method, request.path, exc_info=exc)
                return error.response()

        return route

    return wrap


def _model_name(value: object) -> str | None:
    """`name`: absent, null or "" routes to the default model."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise invalid_request("name: expected a string")
    if len(value) > SESSION_ID_MAX:
        raise invalid_request(f"name: at most {SESSION_ID_MAX} characters")
    return value


def _session_id(value: object, header: str | None = None) -> str:
    """The body's `session_id`, else the X-Session-Id header (when the route reads it)."""
    if value is None or value == "":
        value = header or None
    if value is None:
        where = " (or the X-Session-Id header)" if header is not None else ""
        raise invalid_request(f"session_id: required{where}")
    if not isinstance(value, str):
        raise invalid_request("session_id: expected a non-empty string")
    if len(value) > SESSION_ID_MAX:
        raise invalid_request(f"session_id: at most {SESSION_ID_MAX} characters")
    return value


def _caching_service(name: str | None):
    """(served name, service) for a session route: 404 model_not_found, or 400
    session_caching_disabled when the model keeps no sessions (max_sessions 0)."""
    served, svc = get_runtime().resolve(name)
    if not svc.sessions.enabled:
        raise ApiError(
            400,
            f"model {served!r} has no session cache (max_sessions is 0)",
            "session_caching_disabled",
        )
    return served, svc


@_route("POST")
def export_session(request: HttpRequest) -> HttpResponse:
    """POST /admin/session/export {"name"?, "session_id", "namespace"?}: the id's most
    recently used conversation as a base64 blob plus the tokens it covers (send both back
    to restore). The session id comes from the body only.

    An operator may export any key's session: the caller's own session of that id, else
    the one key's that holds it; `namespace` names the key when several hold the id.
    The reply's `namespace` says whose it was (the blob records it too)."""
    body = parse_json_object(request.body)
    sid = _session_id(body.get("session_id"))
    owner = body.get("namespace")
    if owner is not None and (not isinstance(owner, str) or not owner):
        raise invalid_request("namespace: expected a non-empty string")
    served, svc = _caching_service(_model_name(body.get("name")))
    note(request, model=served, session_id=sid)
    return json_response(export_body(svc.export_session(_export_key(request, svc, sid, owner))))


def _export_key(request: HttpRequest, svc, sid: str, owner: str | None):
    """Which key's session `sid` an export takes (see export_session)."""
    if owner is not None:
        return SessionKey(sid, owner)
    own = tenancy.session_key(request, sid)
    if own in svc.sessions:
        return own
    holders = svc.sessions.owners(sid)
    if len(holders) > 1:
        names = ", ".join(sorted(repr(k.namespace) for k in holders))
        raise invalid_request(
            f"session_id: {len(holders)} API keys hold a session of this id ({names}); "
            "name one with `namespace`"
        )
    return holders[0] if holders else own  # none: SessionNotFound, 404


@_route("POST")
def restore_session(request: HttpRequest) -> HttpResponse:
    """POST /session/restore {"name"?, "session_id", "blob" (base64), "tokens"}: install an
    exported conversation under the session id (a new one or a live one). Everything is
    checked before the session table is touched: a refused restore changes nothing."""
    body, streamed = _restore_body(request)
    sid = _session_id(body.get("session_id"), request.headers.get("X-Session-Id", ""))
    blob_b64 = body.get("blob")
    if blob_b64 is None:
        raise invalid_request("blob: required (the blob_b64 an export returned)")
    if not isinstance(blob_b64, str):
        raise invalid_request("blob: expected a base64 string")
    tokens = body.get("tokens")
    if tokens is None:
        raise invalid_request("tokens: required (the tokens an export returned)")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < TOKEN_ID_LIMIT for t in tokens
    ):
        raise invalid_request("tokens: expected an array of token ids (integers)")
    served, svc = _caching_service(_model_name(body.get("name")))
    note(request, model=served, session_id=sid)
    if len(tokens) > svc.context_window_configured:
        raise invalid_request(
            f"tokens: {len(tokens)} ids, more than this model's "
            f"{svc.context_window_configured}-token context window"
        )
    try:
        blob = streamed.finish() if streamed.used else base64.b64decode(blob_b64, validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII string
        raise BadSessionBlob("blob: not valid base64") from None
    # Into the caller's own namespace, whatever namespace the blob records.
    n_tok = svc.restore_session(tenancy.session_key(request, sid), blob, tokens)
    return json_response({"restored": True, "session_id": sid, "n_tok": n_tok})


def _restore_body(request: HttpRequest) -> tuple[dict, Base64Sink]:
    """A restore's body, up to restore_body_limit() rather than Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE (request.read() does not check it; request.body would).
    Read in chunks: the blob's base64 is decoded as it arrives (pantheon_platform/json_blob),
    never held as text, so memory stays near the decoded blob's size and no single call
    holds the GIL for the whole body. Returns the rest of the body, parsed (its "blob" is
    "" when it was streamed), and the sink holding the decoded blob."""
    limit = restore_body_limit()
    sink = Base64Sink()
    try:
        rest = split_field(request.read, b"blob", limit, sink.feed, sink.fail)
    except BodyTooLarge as exc:
        if exc.outside_field:
            raise invalid_request(
                f"request body: more than {REST_MAX_BYTES >> 20} MiB outside `blob`"
            ) from None
        raise invalid_request(
            f"request body is over {limit} bytes, more than a blob of a full context "
            "window of any served model"
        ) from None
    return parse_json_object(rest), sink


@_route("POST")
def release_session(request: HttpRequest) -> HttpResponse:
    """POST /session/release {"name"?, "session_id"}: free every conversation of the id
    now. Idempotent: an unknown or already released id is also a 200."""
    body = parse_json_object(request.body)
    sid = _session_id(body.get("session_id"), request.headers.get("X-Session-Id", ""))
    served, svc = get_runtime().resolve(_model_name(body.get("name")))
    note(request, model=served, session_id=sid)
    svc.release_session(tenancy.session_key(request, sid))  # the caller's own only
    return json_response({"released": True, "session_id": sid})


@_route("GET")
def estimate_session(request: HttpRequest) -> HttpResponse:
    """GET /session/estimate?tokens=N[&name=M][&blob_bytes=B][&upload_bps=R]: restoring a
    session from a blob vs re-prefilling its tokens, by arithmetic only.

    - rate: the model's measured prefill rate (tokens/s), else the engine's fallback
      (FALLBACK_PREFILL_TOK_PER_S); `prefill_rate_measured` says which.
    - cold_reprefill_s = tokens / rate
    - blob_bytes_est = blob_bytes if given, else tokens * the model's KV bytes per token
      (K and V, float32, every layer: what an export holds) when the model is known,
      else tokens * 16 KiB (the contract's figure)
    - warm_restore_s = blob_bytes_est / upload_bps (default 12.5e6 bytes/s)

    An unknown `name` is not an error: `model` is "" and the fallbacks are used. Seconds
    are rounded to 3 decimals, the rate to 2.
    """
    params = request.GET
    tokens = _positive_int(params, "tokens", required=True)
    blob_bytes = _positive_int(params, "blob_bytes", required=False)
    upload_bps = _positive_number(params, "upload_bps") or ESTIMATE_UPLOAD_BPS
    try:
        model, svc = get_runtime().resolve(_model_name(params.get("name")))
    except (ModelNotFound, NoModelsLoaded):
        model, svc = "", None
    if svc is not None:
        cold_s, rate, measured = svc.estimate_prefill_s(tokens)
        bytes_per_token = svc.kv.bytes_per_token()
    else:
        rate, measured = FALLBACK_PREFILL_TOK_PER_S, False
        cold_s = tokens / rate
        bytes_per_token = ESTIMATE_BYTES_PER_TOKEN
    blob_bytes_est = blob_bytes if blob_bytes is not None else tokens * bytes_per_token
    warm_s = blob_bytes_est / upload_bps
    if not math.isfinite(warm_s):  # a tiny upload_bps: JSON has no Infinity
        raise invalid_request(f"upload_bps: too small, {upload_bps!r} overflows the estimate")
    return json_response(
        {
            "model": model,
            "tokens": tokens,
            "prefill_tok_per_s": round(rate, 2),
            "cold_reprefill_s": round(cold_s, 3),
            "warm_restore_s": round(warm_s, 3),
            "blob_bytes_est": blob_bytes_est,
            "prefill_rate_measured": measured,
        }
    )


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _positive_int(params, key: str, *, required: bool) -> int | None:
    raw = params.get(key)
    if raw is None:
        if required:
            raise invalid_request(f"{key}: required, a positive integer")
        return None
    if not _INTEGER.fullmatch(raw):
        raise invalid_request(f"{key}: expected a positive integer, got {raw[:40]!r}")
    value = int(raw)
    if value <= 0:
        raise invalid_request(f"{key}: must be > 0, got {value}")
    if value > ESTIMATE_MAX:
        raise invalid_request(f"{key}: at most {ESTIMATE_MAX}")
    return value


def _positive_number(params, key: str) -> float | None:
    raw = params.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise invalid_request(f"{key}: expected a positive number, got {raw[:40]!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise invalid_request(f"{key}: must be a finite number > 0, got {raw[:40]!r}")
    return value
