"""Ollama's API (/api/...) as a thin adapter on the chat core: parse -> Turn ->
start_turn -> render the events as NDJSON (streamed by default) or one JSON object.

Every error on these routes has Ollama's shape, `{"error": "message"}`, with its status
(400 bad input, 404 an unknown model); once a stream has opened, an error is a line
`{"error": ...}` (the ollama clients raise it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import ContextOverBudget, TooManyTokens
from pantheon_platform.chat_http import (
    StartedTurn,
    off_loop,
    start_turn,
    turn_deadline,
)
from pantheon_platform.discovery import discovered, load_if_discovered
from pantheon_platform.errors import ApiError, json_response, method_not_allowed
from pantheon_platform.json_slices import sliced_json_response
from pantheon_platform.request_log import note
from pantheon_platform.runtime import LOADING, build_id, get_runtime
from pantheon_platform.strict_json import parse_json_object
from pantheon_platform.tenancy import is_operator
from wire.ollama import render
from wire.ollama import request as parse
from wire.ollama.render import Answer, Clock, NdjsonResponse, error_response
from wire.route import ErrorShape, RouteCall, first_event, post_route

log = logging.getLogger("pantheon.http")

# The Ollama API level these routes follow (GET /api/version): clients gate features on
# it. Pantheon's own version is beside it.
OLLAMA_API_VERSION = "0.12.0"


# Ollama's shape: {"error": "message"}.
OLLAMA_ERRORS = ErrorShape(
    error_of=lambda exc, stream: render.ollama_error(exc), respond=error_response
)


def _refusal(exc: Exception) -> HttpResponse:
    error = render.ollama_error(exc)
    if error.status == 500:
        log.error("ollama request failed", exc_info=exc)  # never in the body
    return error_response(error)


def _method(request: HttpRequest, allowed: str) -> HttpResponse | None:
    if request.method != allowed:
        return error_response(method_not_allowed(request.method or "", [allowed, "OPTIONS"]))
    return None


def resolve(model: str):
    """(served name, service) for an Ollama model name: as sent, then without `:latest`,
    each through the aliases. Unlike the OpenAI routes, the name must name a served model
    even when one model is loaded (Ollama's 404 "model not found")."""
    rt = get_runtime()
    services = rt.services()
    if not services:
        return rt.resolve(model)  # NoModelsLoaded: 503, saying why (loading, failed, none)
    states = rt.states()
    for candidate in parse.name_candidates(model):
        name = rt.follow(candidate)
        if name in services:
            return rt.resolve(name)
        if getattr(states.get(name), "state", None) == LOADING:
            raise ApiError(
                503,
                f'model "{model}" is still loading; retry shortly',
                "model_loading",
                headers={"Retry-After": "1"},
            )
    served = ", ".join(sorted(parse.ollama_name(n) for n in services)) or "none"
    raise ApiError(
        404,
        f'model "{model}" not found (models are loaded by the operator here, not pulled); '
        f"served models: {served}",
        "model_not_found",
    )


def _check_window(parsed: parse.OllamaRequest, svc) -> None:
    """`options.num_ctx` above the served window is refused, not silently truncated; at
    or below it, accepted (the window is the operator's load option)."""
    window = svc.context_window
    if parsed.num_ctx is not None and window and parsed.num_ctx > window:
        raise ApiError(
            400,
            f"options.num_ctx: {parsed.num_ctx} is above this model's served context "
            f"window ({window} tokens, set by the operator at load); send at most {window} "
            "or leave num_ctx out",
            "invalid_request_error",
            extra={"param": "options.num_ctx"},
        )


# --- /api/chat, /api/generate ----------------------------------------------------------


@post_route(OLLAMA_ERRORS, "ollama request failed")
async def chat(request: HttpRequest, call: RouteCall) -> HttpResponse:
    return await _turn(request, chat=True)


@post_route(OLLAMA_ERRORS, "ollama request failed")
async def generate(request: HttpRequest, call: RouteCall) -> HttpResponse:
    return await _turn(request, chat=False)


async def _turn(request: HttpRequest, *, chat: bool) -> HttpResponse:
    """Async: a generation waits on the engine without holding a worker thread."""
    clock = Clock()
    header = request.headers.get("X-Session-Id")
    deadline = turn_deadline()

    def parse_body() -> parse.OllamaRequest:
        data = parse_json_object(request.body)
        if chat:
            return parse.parse_chat(data, header)
        return parse.parse_generate(data, header)

    parsed = await off_loop(deadline, parse_body)
    await load_if_discovered(parsed.model)  # a model on disk (PANTHEON_DISCOVER)
    name, svc = resolve(parsed.model)
    _check_window(parsed, svc)
    thinks = svc.think_style or svc.harmony
    if parsed.enable_thinking and not thinks and parsed.raw_prompt is None:
        raise ApiError(  # Ollama's answer too: nothing would think
            400,
            f'think: model "{parsed.model}" does not support thinking (its chat template '
            "has no think block); leave think out or send false",
            "invalid_request_error",
            extra={"param": "think"},
        )
    if not parsed.messages:  # Ollama's "load the model": it is loaded
        return json_response(render.load_answer(parsed.model, chat))
    started = await start_turn(
        request,
        parsed.turn(f"ollama-{secrets.token_hex(12)}"),
        model=name,
        session_id=parsed.session_id,
        deadline=deadline,
    )
    clock.mark_ready()
    answer = Answer(parsed.model, chat, parsed.logprobs, clock)
    ttl = parse.keep_alive_seconds(parsed.keep_alive)

    def turn_over() -> None:
        _keep_alive(started, ttl)

    if parsed.stream:
        first = await first_event(started.events)
        return NdjsonResponse(render.lines(started.events, answer, first, turn_over))
    return await render.complete(started.events, answer, turn_over)


def _keep_alive(started: StartedTurn, ttl: float | None) -> None:
    """keep_alive as the conversation's idle TTL in the session cache, once its turn is
    over (the engine stream closed: the turn has parked its KV); no session, no effect."""
    session_id = started.prepared.request.session_id
    if ttl is not None and session_id is not None and started.svc.sessions.enabled:
        started.svc.sessions.set_idle_ttl(session_id, ttl)


# --- /api/embed, /api/embeddings -------------------------------------------------------


@post_route(OLLAMA_ERRORS, "ollama request failed")
async def embed(request: HttpRequest, call: RouteCall) -> HttpResponse:
    return await _embed(request, legacy=False)


@post_route(OLLAMA_ERRORS, "ollama request failed")
async def embeddings(request: HttpRequest, call: RouteCall) -> HttpResponse:
    return await _embed(request, legacy=True)


async def _embed(request: HttpRequest, *, legacy: bool) -> HttpResponse:
    """Each input tokenized as a raw prompt (no template), prefilled alone on a scratch
    cache and pooled, L2-normalised (ModelService.embed: the model's `pooling`)."""
    clock = Clock()
    deadline = turn_deadline()
    parsed = await off_loop(
        deadline, lambda: parse.parse_embed(parse_json_object(request.body), legacy=legacy)
    )
    name, svc = resolve(parsed.model)
    note(request, model=name)
    width = svc.embedding_width
    if parsed.dimensions is not None and parsed.dimensions != width:
        raise ApiError(
            400,
            f"dimensions: this model's embeddings have {width} dimensions and cannot be "
            f"shortened; leave dimensions out (or send {width})",
            "invalid_request_error",
        )
    lists = await off_loop(deadline, lambda: _token_lists(svc, parsed))
    clock.mark_ready()
    vectors = await asyncio.wrap_future(svc.embed(lists)) if lists else []
    clock.mark_end()
    if legacy:
        body = lambda: {"embedding": vectors[0].tolist() if len(vectors) else []}  # noqa: E731
    else:
        body = lambda: {  # noqa: E731
            "model": parsed.model,
            "embeddings": [v.tolist() for v in vectors],
            "total_duration": clock.end - clock.start,
            "load_duration": clock.ready - clock.start,
            "prompt_eval_count": sum(len(ids) for ids in lists),
        }
    # Off the event loop: a large batch's vectors are megabytes of JSON.
    return await asyncio.to_thread(lambda: sliced_json_response(body()))


def _token_lists(svc, parsed: parse.EmbedRequest) -> list[list[int]]:
    """Each input's ids, as a raw prompt is tokenized; one over the window is cut to it
    when `truncate` (Ollama's default), else refused."""
    window = svc.context_window_configured
    out = []
    for text in parsed.inputs:
        while True:
            try:
                ids = svc.encode_raw(text)
                break
            except TooManyTokens as exc:  # certain not to fit, refused untokenized
                if not parsed.truncate:
                    raise ContextOverBudget(exc.at_least, exc.limit, at_least=True) from None
                # A prefix the bound no longer refuses (it shrinks every time).
                keep = exc.limit * max(1, len(text) // max(1, exc.at_least))
                text = text[: min(keep, len(text) // 2)]
        if len(ids) > window:
            if not parsed.truncate:
                raise ContextOverBudget(len(ids), window)
            ids = ids[:window]
        if not ids:
            raise ApiError(400, "input: an input has no tokens to embed", "invalid_request_error")
        out.append(ids)
    return out


# --- models ----------------------------------------------------------------------------


def _listed() -> list[tuple[str, object]]:
    """(Ollama name, service) of every served name and every alias of one, by name."""
    rt = get_runtime()
    services = rt.services()
    rows = {parse.ollama_name(n): svc for n, svc in services.items()}
    for alias, _target in rt.aliases().items():
        svc = services.get(rt.follow(alias))
        if svc is not None:
            rows.setdefault(parse.ollama_name(alias), svc)
    return sorted(rows.items())


@csrf_exempt
def tags(request: HttpRequest) -> HttpResponse:
    """GET /api/tags: the loaded models (and their aliases) as Ollama lists local ones."""
    if refused := _method(request, "GET"):
        return refused
    try:
        rows = [render.tags_row(n, s) for n, s in _listed()]
        listed = {row["name"] for row in rows}
        rows += [  # models on disk (PANTHEON_DISCOVER) not loaded yet, when they may load
            render.discovered_tags_row(parse.ollama_name(m.name), m)
            for m in discovered()
            if not m.error and parse.ollama_name(m.name) not in listed
        ]
        return json_response({"models": rows})
    except Exception as exc:
        return _refusal(exc)


@csrf_exempt
def ps(request: HttpRequest) -> HttpResponse:
    """GET /api/ps: the running models (every loaded one; they stay until unloaded)."""
    if refused := _method(request, "GET"):
        return refused
    try:
        return json_response({"models": [render.ps_row(n, s) for n, s in _listed()]})
    except Exception as exc:
        return _refusal(exc)


@csrf_exempt
def show(request: HttpRequest) -> HttpResponse:
    """POST /api/show: the model's details, chat template, parameters and GGUF metadata."""
    if refused := _method(request, "POST"):
        return refused
    try:
        model, verbose = parse.parse_show(parse_json_object(request.body))
        name, svc = resolve(model)
        return json_response(render.show_body(name, svc, verbose, full_path=is_operator(request)))
    except Exception as exc:
        return _refusal(exc)


@csrf_exempt
def version(request: HttpRequest) -> HttpResponse:
    if refused := _method(request, "GET"):
        return refused
    return json_response({"version": OLLAMA_API_VERSION, "pantheon": build_id()})


MANAGED = {
    "pull": "pulling models",
    "push": "pushing models",
    "create": "creating models",
    "delete": "deleting models",
    "copy": "copying models",
}


def managed_method(action: str) -> str:
    """Ollama's method for the action: DELETE /api/delete, POST the others."""
    return "DELETE" if action == "delete" else "POST"


@csrf_exempt
def managed(request: HttpRequest, action: str) -> HttpResponse:
    """/api/pull, /push, /create, /delete, /copy: refused; models are the operator's."""
    if refused := _method(request, managed_method(action)):
        return refused
    return error_response(
        ApiError(
            403,
            f"{MANAGED[action]} is not supported here: models are loaded and unloaded by "
            "the operator (POST /admin/models/load, /admin/models/unload, /admin/aliases); "
            "GET /api/tags lists the loaded ones",
            "operator_managed",
        )
    )
