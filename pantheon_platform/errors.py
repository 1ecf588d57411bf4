"""Every error leaves the server as {"error": {"message", "type", "code": null}}.

ApiError is what views raise; `api_error_from` maps engine and runtime exceptions onto
it; the DRF exception handler and Django's handler400/403/404/500 render the same shape,
so no route can answer with HTML or a traceback.
"""

from __future__ import annotations

import json
import logging

from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

from engine import (
    BadSessionBlob,
    ContextOverBudget,
    GenerationFailed,
    InvalidTurn,
    ServerBusy,
    ServerMemoryConstrained,
    ServerShuttingDown,
    SessionBusy,
    SessionCapacity,
    SessionNotFound,
    WatchUnavailable,
    WeightsVersionMismatch,
)
from pantheon_platform.request_log import note_error
from pantheon_platform.runtime import ModelNotFound, NoModelsLoaded

log = logging.getLogger("pantheon.http")

# The error's type as a header on every refusal, whatever the route's error shape: the
# router acts on some (nothing ran: it sends the request elsewhere; cluster/dispatch.py).
ERROR_TYPE_HEADER = "X-Pantheon-Error-Type"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        *,
        extra: dict | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.extra = extra or {}
        # Every refusal names its type in a header as well as in its body: a router (and
        # any proxy) reads it whatever the route's error shape (cluster/dispatch.py).
        self.headers = {**(headers or {}), ERROR_TYPE_HEADER: type}

    def body(self) -> dict:
        return error_body(self.message, self.type, **self.extra)

    def response(self) -> JsonResponse:
        return json_response(self.body(), status=self.status, headers=self.headers)


def json_response(body: dict, status: int = 200, headers: dict[str, str] | None = None):
    """Compact JSON, byte-for-byte like the contract's examples (and DRF's renderer)."""
    return JsonResponse(
        body, status=status, headers=headers, json_dumps_params={"separators": (",", ":")}
    )


def error_body(message: str, type: str, **extra: object) -> dict:
    return {"error": {"message": message, "type": type, "code": None, **extra}}


# Anthropic's error types by status (its Messages routes answer in its shape).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict:
    kind = ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {"type": "error", "error": {"type": kind, "message": message}}


def wire_error_body(path: str, status: int, message: str, type: str) -> dict:
    """The error body in the shape of the wire format `path` speaks: Anthropic's on
    /v1/messages, Ollama's (`{"error": message}`) on /api/, the contract's elsewhere. For
    the layers that answer before any view, so a client's SDK parses every refusal."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic_error_body(status, message)
    if path.startswith("/api/"):
        return {"error": message}
    return error_body(message, type)


async def send_asgi_error(
    send, status: int, message: str, type: str, headers=(), path: str = ""
) -> None:
    """The error shape straight from an ASGI layer (the access guard, the body limit),
    before any view, in the shape of the route's wire format (`wire_error_body`): with
    the CORS header every response carries, and Connection: close (the client may still
    be sending a body nobody will read). `headers`: extra (name, value) byte pairs."""
    body = json.dumps(wire_error_body(path, status, message, type), separators=(",", ":"))
    body = body.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"access-control-allow-origin", b"*"),
                (b"connection", b"close"),
                (ERROR_TYPE_HEADER.lower().encode(), type.encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def invalid_request(message: str, param: str | None = None) -> ApiError:
    """400 invalid_request_error; `param`: the field at fault (a path such as
    `messages[0].content`), when one is named."""
    extra = {"param": param} if param is not None else None
    return ApiError(400, message, "invalid_request_error", extra=extra)


def method_not_allowed(method: str, allowed: list[str]) -> ApiError:
    return ApiError(
        405,
        f"method {method} is not allowed on this route",
        "method_not_allowed",
        headers={"Allow": ", ".join(allowed)},
    )


def server_error() -> ApiError:
    return ApiError(500, "internal server error", "server_error")


def shutting_down(message: str = "") -> ApiError:
    """503 while the server drains for shutdown; `Retry-After: 1` (the contract)."""
    return ApiError(
        503,
        message or "the server is shutting down; retry shortly (elsewhere)",
        "server_shutting_down",
        headers={"Retry-After": "1"},
    )


def _retry_after(seconds: int | None) -> dict[str, str]:
    return {"Retry-After": str(max(1, int(seconds)))} if seconds is not None else {}


def api_error_from(exc: Exception, *, stream: bool = False) -> ApiError:
    """The contract's status and type for an exception out of the runtime or the engine,
    noted for the request's access-log record (a 429's reason in the metrics).

    Unknown exceptions become a bare 500 (logged with the traceback by the caller).
    """
    error = _error_from(exc, stream)
    note_error(error.type)
    return error


def _error_from(exc: Exception, stream: bool) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, SuspiciousOperation):
        # e.g. RequestDataTooBig on request.body; Django's message names the limit only.
        return invalid_request(str(exc) or "bad request")
    if isinstance(exc, InvalidTurn):  # the chat core refused the turn
        return invalid_request(exc.message, exc.param)
    if isinstance(exc, ContextOverBudget):
        return context_overflow(exc, stream)
    if isinstance(exc, ServerBusy):
        message = str(exc) or "every slot is busy and the queue is full; retry later"
        return ApiError(429, message, "server_busy", headers=_retry_after(exc.retry_after))
    if isinstance(exc, ServerMemoryConstrained):
        message = str(exc) or "memory pressure: the server cannot take this prompt now"
        return ApiError(
            503, message, "server_memory_constrained", headers=_retry_after(exc.retry_after)
        )
    if isinstance(exc, ServerShuttingDown):
        return shutting_down(str(exc))
    if isinstance(exc, NoModelsLoaded):
        return ApiError(503, str(exc), "no_models_loaded")
    if isinstance(exc, ModelNotFound):
        return ApiError(404, str(exc), "model_not_found")
    if isinstance(exc, GenerationFailed):
        return ApiError(500, f"generation failed: {exc}", "server_error")
    session_error = _SESSION_ERRORS.get(type(exc))
    if session_error is not None:
        status, type_ = session_error
        headers = None
        if isinstance(exc, SessionCapacity):
            headers = _retry_after(exc.retry_after)
        if isinstance(exc, SessionBusy):
            headers = _retry_after(1)
        return ApiError(status, str(exc), type_, headers=headers)
    return server_error()


def context_overflow(exc: ContextOverBudget, stream: bool) -> ApiError:
    """400 with OpenAI's `code: "context_length_exceeded"` (what the OpenAI SDK and
    LangChain's ChatOpenAI recognise as an overflow: ContextOverflowError), our type, and
    the numbers as fields: `context_window`, `prompt_tokens` (a lower bound when the
    message says "at least"); a streamed request's error also has kv_used/kv_cap (the
    contract's streaming error event)."""
    extra: dict = {
        "code": "context_length_exceeded",
        "context_window": exc.kv_cap,
        "prompt_tokens": exc.prompt_tokens,
    }
    if stream:
        extra |= {"kv_used": exc.prompt_tokens, "kv_cap": exc.kv_cap}
    # The code in the message too: the OpenAI SDK's exception text is the message alone,
    # and that text is what LangChain searches for it.
    message = f"{exc} (code: context_length_exceeded)"
    return ApiError(400, message, "context_over_budget", extra=extra)


_SESSION_ERRORS = {
    SessionCapacity: (429, "model_at_session_capacity"),
    SessionNotFound: (404, "session_not_found"),
    SessionBusy: (429, "session_busy"),
    BadSessionBlob: (400, "bad_session_blob"),
    WeightsVersionMismatch: (409, "weights_version_mismatch"),
    WatchUnavailable: (503, "watch_unavailable"),
}


# --- DRF ----------------------------------------------------------------------------

_DRF_TYPES = {
    drf_exceptions.ParseError: "invalid_request_error",
    drf_exceptions.ValidationError: "invalid_request_error",
    drf_exceptions.UnsupportedMediaType: "invalid_request_error",
    drf_exceptions.NotFound: "not_found",
    drf_exceptions.MethodNotAllowed: "method_not_allowed",
    drf_exceptions.NotAcceptable: "not_acceptable",
}


def drf_exception_handler(exc: Exception, context: dict) -> Response:
    """DRF's EXCEPTION_HANDLER: every exception out of an APIView, known or not, becomes
    the error shape. Unknown ones are logged and answered as a bare 500, in DEBUG too."""
    from django.core.exceptions import PermissionDenied
    from django.http import Http404

    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound("unknown route")
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()

    if isinstance(exc, drf_exceptions.APIException):
        type_ = next((t for cls, t in _DRF_TYPES.items() if isinstance(exc, cls)), None)
        headers = {}
        if isinstance(exc, drf_exceptions.MethodNotAllowed):
            view = context.get("view")
            if view is not None:
                headers["Allow"] = ", ".join(view.allowed_methods)
        message = _drf_message(exc.detail)
        return Response(
            error_body(message, type_ or exc.default_code),
            status=exc.status_code,
            headers=headers,
        )

    error = api_error_from(exc)
    if error.status == 500:
        log.error("unhandled error in %s", context.get("view"), exc_info=exc)
    return Response(error.body(), status=error.status, headers=error.headers)


def _drf_message(detail: object) -> str:
    if isinstance(detail, dict):
        field, value = next(iter(detail.items()))
        return f"{field}: {_drf_message(value)}"
    if isinstance(detail, list) and detail:
        return _drf_message(detail[0])
    return str(detail)


# --- Django handlers (pantheon_site/urls.py) ----------------------------------------


@csrf_exempt  # the catch-all route: a POST to an unknown path is a 404, not a CSRF 403
def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """Catch-all route and handler404. The body is exact, per the contract."""
    return ApiError(404, "unknown route", "not_found").response()


def bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    # e.g. RequestDataTooBig; Django's messages for these name the limit, not internals.
    return invalid_request(str(exception) if exception else "bad request").response()


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return ApiError(403, "forbidden", "permission_denied").response()


def csrf_failure(request: HttpRequest, reason: str = "") -> JsonResponse:
    """CSRF_FAILURE_VIEW: only the /console/ forms are CSRF-protected; the API is exempt."""
    return ApiError(403, f"CSRF verification failed: {reason}", "permission_denied").response()


def server_error_view(request: HttpRequest) -> JsonResponse:
    # Django has already logged the traceback (django.request); the body never has it.
    return server_error().response()
