"""Client routes about the server rather than a conversation: GET / (what this process
runs on and what is loading), GET /v1/models (and /models), GET /v1/models/{id} (and
/models/{id}), GET /health (llama.cpp's shape), and the operator's test hook POST
/admin/debug/simulate-memory-pressure (PANTHEON_DEBUG_ROUTES).

The registry is looked up per call (`get_runtime()`), so a test that swaps the
process-wide Runtime is seen here too.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from pantheon_platform import live_settings, shutdown
from pantheon_platform.discovery import discovered, find
from pantheon_platform.errors import (
    ApiError,
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
    not_found,
)
from pantheon_platform.runtime import (
    FAILED,
    GRAPH_SUMMARY_KEYS,
    LOADING,
    UNLOADING,
    backend_name,
    build_id,
    default_options,
    device_facts,
    get_runtime,
)
from pantheon_platform.strict_json import parse_json_object

log = logging.getLogger("pantheon.http")


# --- GET / --------------------------------------------------------------------------


class HealthView(APIView):
    """GET /: always 200; says what this process runs on and what is (still) loading."""

    def get(self, request):
        services = get_runtime().services()
        states = get_runtime().states()
        device = device_facts()
        body = {
            "service": "pantheon",
            "status": "ok",
            "backend": device.backend,
            # The compiled CPU kernels, or "numpy" when they could not be built: said, not
            # silent (each model's row says what it loaded with).
            "kernel": device.kernel,
            "build": build_id(),
            "accelerator": any(svc.on_accelerator for svc in services.values()),
            "dies_visible": device.dies_visible,
            "models": {name: s.state for name, s in states.items()},
        }
        if device.kernel_isa:
            body["kernel_isa"] = device.kernel_isa
        if device.kernel_activations:
            body["kernel_activations"] = device.kernel_activations
        load_errors = {name: s.error for name, s in states.items() if s.state == FAILED}
        if load_errors:
            body["load_errors"] = load_errors
        progress = {i.name: i.progress.as_dict() for i in get_runtime().loading() if i.progress}
        if progress:  # while a load runs: how far it has got
            body["progress"] = progress
        return Response(body)


# --- GET /v1/models, /v1/models/{id} ------------------------------------------------


def model_row(name: str, svc) -> dict:
    """One served model as /v1/models lists it (and /v1/models/{id} returns it)."""
    row = {
        "id": name,
        "object": "model",
        "created": svc.created,
        "owned_by": "pantheon",
        "max_sessions": svc.max_sessions,
        "max_concurrent": svc.max_concurrent,
    }
    # A "required" tool call is compelled after an unconstrained think block (every
    # dialect has a grammar; none when tool_grammar is off: PANTHEON_TOOL_GRAMMAR=0).
    row["tool_choice_required_with_thinking"] = svc.think_style and (
        live_settings.value("tool_grammar") != "off"
    )
    if svc.context_window:  # omitted when unknown, never 0 (the contract)
        row["context_window"] = svc.context_window
    graphs = svc.graphs
    if graphs:  # decode steps through CUDA-graph slots, once one was exercised
        row["graphs"] = {k: graphs[k] for k in GRAPH_SUMMARY_KEYS}
    attention = svc.attention
    if attention:  # a model on dies, once a pass has reached its layers
        row["attention"] = {k: attention[k] for k in ("ondie", "host", "total")}
    return row


def discovered_row(found) -> dict:
    """A model on disk not loaded yet (pantheon_platform.discovery): loadable, or not and
    why (a blob that is not a GGUF, a missing file, an unreadable manifest)."""
    defaults = default_options()  # what the load will get
    row = {
        "id": found.name,
        "object": "model",
        "created": int(found.modified),
        "owned_by": found.source,
        "max_sessions": defaults["max_sessions"],
        "max_concurrent": defaults["max_concurrent"] or defaults["max_sessions"],
        "loaded": False,
        "loadable": not found.error,
    }
    if found.error:
        row["error"] = found.error
    return row


class ModelsView(APIView):
    """GET /v1/models: one row per served name, loaded models only."""

    def get(self, request):
        services = get_runtime().services()
        data = [model_row(name, svc) for name, svc in sorted(services.items())]
        # Models on disk (PANTHEON_DISCOVER) not loaded yet: a request naming one loads it.
        data += [discovered_row(m) for m in discovered() if m.name not in services]
        return Response(
            {"object": "list", "backend": backend_name(), "build": build_id(), "data": data}
        )


class ModelView(APIView):
    """GET /v1/models/{id}: the row /v1/models lists for that served name; an alias
    stands for its target (as `model` on a completion). Unlike a completion's `model`,
    the id must name a served model even when only one is loaded: 404 model_not_found."""

    def get(self, request, model_id: str):
        rt = get_runtime()
        name = rt.follow(model_id)
        svc = rt.services().get(name)
        if svc is None and (found := find(model_id)) is not None:
            return Response(discovered_row(found))
        if svc is None:
            raise ApiError(404, _not_served(rt, model_id, name), "model_not_found")
        return Response(model_row(name, svc))


def _not_served(rt, model_id: str, name: str) -> str:
    via = f" (an alias of {name!r})" if name != model_id else ""
    state = getattr(rt.states().get(name), "state", None)
    if state == LOADING:
        return f"model {model_id!r}{via} is still loading; retry shortly"
    if state == UNLOADING:
        return f"model {model_id!r}{via} is being unloaded"
    if state == FAILED:
        return f"model {model_id!r}{via} failed to load (GET / says why)"
    served = ", ".join(sorted(rt.services())) or "none"
    return f"model {model_id!r}{via} does not exist; served models: {served}"


# --- GET /health ---------------------------------------------------------------------


class LlamaHealthView(APIView):
    """GET /health, llama.cpp's readiness check: 200 {"status": "ok"} once a model is
    loaded and none is loading, else 503 in llama.cpp's error shape ("Loading model" while
    the server starts or a model loads). GET / is the descriptive health check."""

    def get(self, request):
        problem = _not_ready()
        if problem is None:
            return Response({"status": "ok"})
        return Response(
            {"error": {"code": 503, "message": problem, "type": "unavailable_error"}},
            status=503,
        )


def _not_ready() -> str | None:
    """Why the server cannot serve completions now (llama.cpp's messages), or None."""
    if shutdown.draining():
        return "Shutting down"
    rt = get_runtime()
    loading = any(s.state == LOADING for s in rt.states().values())
    # `_starting`: the loader has not read the model list yet (nothing is listed).
    if loading or getattr(rt, "_starting", False):
        return "Loading model"
    if not rt.services():
        return "No model loaded"
    return None


# --- POST /admin/debug/simulate-memory-pressure --------------------------------------

PRESSURE_LEVELS = {name: i for i, name in enumerate(("normal", "elevated", "high", "critical"))}


@csrf_exempt
def simulate_memory_pressure(request: HttpRequest) -> HttpResponse:
    """Operator test hook (PANTHEON_DEBUG_ROUTES=1, else the JSON 404): pin a model's
    memory-pressure ladder at a level, or `null` to follow real free memory again.

    Body: {"model": name (optional with one model), "level": "normal" | "elevated" |
    "high" | "critical" | 0..3 | null}. Answers the served numbers after the move.
    """
    if not getattr(settings, "PANTHEON_DEBUG_ROUTES", False):
        return not_found(request)
    if request.method != "POST":
        return method_not_allowed(request.method or "", ["POST", "OPTIONS"]).response()
    try:
        body = parse_json_object(request.body)
        level = body.get("level")
        if isinstance(level, str) and level in PRESSURE_LEVELS:
            level = PRESSURE_LEVELS[level]
        if level is not None and (
            isinstance(level, bool) or not isinstance(level, int) or level not in range(4)
        ):
            raise invalid_request(
                "level: expected one of normal, elevated, high, critical, 0..3 or null"
            )
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise invalid_request("model: expected a string")
        name, svc = get_runtime().resolve(model)
        svc.simulate_memory_pressure(level)
    except Exception as exc:
        error = api_error_from(exc)
        if error.status == 500:
            log.error("simulate-memory-pressure failed", exc_info=exc)
        return error.response()
    return json_response(
        {
            "model": name,
            "memory_pressure": svc.memory_pressure,
            "simulated": level is not None,
            "max_concurrent": svc.max_concurrent,
            "max_concurrent_configured": svc.max_concurrent_configured,
            "context_window": svc.context_window,
            "context_window_configured": svc.context_window_configured,
        }
    )
