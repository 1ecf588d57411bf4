"""Client routes about the server rather than a conversation: GET /v1/models (and
/models), GET /v1/models/{id} (and /models/{id}), GET /health (llama.cpp's shape).

The registry is looked up per call (`get_runtime()`), so a test that swaps the
process-wide Runtime is seen here too.
"""

from __future__ import annotations

from rest_framework.response import Response
from rest_framework.views import APIView

from pantheon_platform import live_settings, shutdown
from pantheon_platform.errors import ApiError
from pantheon_platform.runtime import (
    FAILED,
    GRAPH_SUMMARY_KEYS,
    LOADING,
    UNLOADING,
    backend_name,
    build_id,
    get_runtime,
)


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


class ModelsView(APIView):
    """GET /v1/models: one row per served name, loaded models only."""

    def get(self, request):
        services = get_runtime().services()
        data = [model_row(name, svc) for name, svc in sorted(services.items())]
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
