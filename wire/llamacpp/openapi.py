"""The OpenAPI pieces of llama-server's routes (wire/llamacpp): GET /props, GET /slots,
POST /completion, POST /infill. The request bodies are the parser's tables
(wire/llamacpp/request.py); the answers are typed here.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from pantheon_platform.openapi import (
    BOOL,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    obj,
    ok,
    operation,
    ref,
    sse_event,
)
from wire.llamacpp.request import COMPLETION, INFILL

_ANY_OBJECT = {"type": "object"}


def schemas() -> dict:
    slot = obj(
        {
            "id": NON_NEGATIVE,
            "id_task": {"type": "integer"},
            "n_ctx": NON_NEGATIVE,
            "speculative": BOOL,
            "is_processing": BOOL,
            "params": _ANY_OBJECT,
            "next_token": _ANY_OBJECT,
        },
        ("id", "n_ctx", "is_processing", "params"),
    )
    timings = obj(
        {
            "prompt_n": NON_NEGATIVE,
            "prompt_ms": NUMBER,
            "predicted_n": NON_NEGATIVE,
            "predicted_ms": NUMBER,
            "predicted_per_second": NUMBER,
        },
        ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms"),
    )
    return {
        "LlamaCompletionRequest": COMPLETION.schema(
            additionalProperties=True,
            description="llama-server's /completion. One prompt (a string or token ids); "
            "sampler options this server lacks (mirostat, DRY, XTC, grammar, ...) are "
            "ignored, as are other fields.",
        ),
        "LlamaInfillRequest": INFILL.schema(
            additionalProperties=True,
            description="llama-server's /infill: input_prefix, input_suffix, input_extra "
            "(files of context) and prompt around the model's FIM tokens; /completion's "
            "options too. 400 not_supported_error for a model without FIM tokens.",
        ),
        "LlamaCompletion": obj(
            {
                "content": STRING,
                "stop": BOOL,
                "model": STRING,
                "tokens_predicted": NON_NEGATIVE,
                "tokens_evaluated": NON_NEGATIVE,
                "generation_settings": _ANY_OBJECT,
                "prompt": STRING,
                "stop_type": {"enum": ["eos", "limit", "word"]},
                "stopping_word": STRING,
                "tokens_cached": NON_NEGATIVE,
                "truncated": BOOL,
                "timings": timings,
            },
            ("content", "stop", "model", "tokens_predicted", "tokens_evaluated", "stop_type"),
        ),
        "LlamaSlot": slot,
        "LlamaProps": obj(
            {
                "default_generation_settings": slot,
                "total_slots": NON_NEGATIVE,
                "model_alias": STRING,
                "model_path": STRING,
                "chat_template": STRING,
                "modalities": _ANY_OBJECT,
                "build_info": STRING,
                "is_sleeping": BOOL,
            },
            ("default_generation_settings", "total_slots", "model_path", "chat_template"),
        ),
    }


_MODEL_QUERY = {
    "name": "model",
    "in": "query",
    "required": False,
    "description": "The served model (any name reaches a lone one).",
    "schema": {"type": "string"},
}


def _generation(path: str, operation_id: str, summary: str, body: str, errors) -> dict:
    return {
        "post": operation(
            path,
            operation_id,
            summary,
            {
                "description": "The completion, or (stream: true) its events.",
                "content": {
                    JSON: {"schema": ref("LlamaCompletion")},
                    SSE: {
                        "schema": sse_event(
                            "`data: {content, stop: false, ...}` per piece, then the final "
                            "`data: {...}` with stop: true and every field (no [DONE]); a "
                            "failure after the stream opened is a `data: {error}`."
                        )
                    },
                },
            },
            errors,
            body=ref(body),
            tag="client",
        )
    }


def add_paths(paths: dict[str, dict]) -> None:
    """Add llama-server's routes to `paths` (before openapi.py adds the layers' errors
    and the preflights)."""
    paths["/props"] = {
        "get": operation(
            "/props",
            "llamaProps",
            "llama-server's /props: the served model's default generation settings, slots, "
            "chat template (model_path: the GGUF's file name; its full path for an operator)",
            ok(ref("LlamaProps")),
            (400, 404, 503),
            parameters=[_MODEL_QUERY],
            tag="client",
        )
    }
    paths["/slots"] = {
        "get": operation(
            "/slots",
            "llamaSlots",
            "llama-server's /slots: each slot served now, the busy ones processing; "
            "?fail_on_no_slot=1: 503 when none is free",
            ok({"type": "array", "items": ref("LlamaSlot")}),
            (400, 404, 503),
            parameters=[
                _MODEL_QUERY,
                {
                    "name": "fail_on_no_slot",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                },
            ],
            tag="client",
        )
    }
    paths["/completion"] = _generation(
        "/completion",
        "llamaCompletion",
        "llama-server's /completion: a raw prompt completed, no chat template",
        "LlamaCompletionRequest",
        (400, 404, 429, 503),
    )
    paths["/infill"] = _generation(
        "/infill",
        "llamaInfill",
        "llama-server's /infill: code filled in between a prefix and a suffix",
        "LlamaInfillRequest",
        (400, 404, 429, 503),
    )
