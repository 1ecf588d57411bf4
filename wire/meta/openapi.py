"""The OpenAPI piece of the meta routes (wire/meta/views.py): GET /, GET /v1/models and
/v1/models/{model_id}, llama.cpp's GET /health, and the debug route when
PANTHEON_DEBUG_ROUTES is on. wire/openapi.py puts it beside the chat route's and adds
the spellings without /v1."""

from __future__ import annotations

from pantheon_platform.openapi import (
    ATTENTION,
    BOOL,
    GRAPHS,
    INT,
    LOAD_PROGRESS,
    NON_NEGATIVE,
    STRING,
    nullable,
    obj,
    ok,
    operation,
    ref,
)

DEBUG_PATH = "/admin/debug/simulate-memory-pressure"

_MODEL_ENTRY = obj(
    {
        "id": STRING,
        "object": {"const": "model"},
        "created": INT,
        "owned_by": STRING,
        "max_sessions": NON_NEGATIVE,
        "max_concurrent": NON_NEGATIVE,
        "context_window": {
            "type": "integer",
            "minimum": 1,
            "description": "The effective window (usage.kv_cap); omitted when unknown.",
        },
        "tool_choice_required_with_thinking": BOOL,
        "graphs": GRAPHS,
        "attention": ATTENTION,
        "loaded": {
            **BOOL,
            "description": "false: a model on disk (PANTHEON_DISCOVER) that a request "
            "naming it loads; owned_by says whose store (ollama, lmstudio, huggingface). "
            "Omitted for loaded models.",
        },
        "loadable": {**BOOL, "description": "A model on disk: whether it can load."},
        "error": {**STRING, "description": "A model on disk that cannot load: why."},
    },
    ("id", "object", "created", "owned_by", "max_sessions", "max_concurrent"),
)

_HEALTH = obj(
    {
        "service": {"const": "pantheon"},
        "status": {"const": "ok"},
        "backend": {"type": "string", "description": "cpu or cuda"},
        "kernel": {
            "type": "string",
            "enum": ["cpu", "numpy", "cuda"],
            "description": "cpu: compiled kernels on the GGUF blocks; numpy: the float32 "
            "reference (also when the kernels could not be built); cuda: the GPU backend "
            "(PANTHEON_BACKEND=cuda)",
        },
        "kernel_isa": {"type": "string", "description": "avx512, avx2 or generic (cpu only)"},
        "kernel_activations": {
            "type": "string",
            "enum": ["float32", "bfloat16"],
            "description": "what the decode products round activations to (cpu only; "
            "bfloat16 is opt-in: PANTHEON_ACTIVATIONS)",
        },
        "build": {"type": "string", "description": "git commit, -dirty, or unknown"},
        "accelerator": BOOL,
        "dies_visible": NON_NEGATIVE,
        "models": {
            "type": "object",
            "additionalProperties": {
                "type": "string",
                "enum": ["loading", "loaded", "unloading", "failed"],
            },
        },
        "load_errors": {"type": "object", "additionalProperties": STRING},
        "progress": {
            "type": "object",
            "description": "While models load: each one's progress.",
            "additionalProperties": LOAD_PROGRESS,
        },
    },
    ("service", "status", "backend", "kernel", "build", "accelerator", "dies_visible", "models"),
)


def schemas() -> dict:
    return {
        "Health": _HEALTH,
        "ModelList": obj(
            {
                "object": {"const": "list"},
                "backend": STRING,
                "build": STRING,
                "data": {"type": "array", "items": _MODEL_ENTRY},
            },
            ("object", "backend", "build", "data"),
        ),
        "Model": _MODEL_ENTRY,
        "LlamaHealth": obj({"status": {"const": "ok"}}, ("status",)),
    }


def path_items() -> dict[str, dict]:
    """GET /, /v1/models, /health and /v1/models/{model_id}: their path items."""
    return {
        "/": {
            "get": operation(
                "/",
                "health",
                "Health: backend, build, each model's state",
                ok(ref("Health")),
                tag="client",
            )
        },
        "/v1/models": {
            "get": operation(
                "/v1/models",
                "listModels",
                "The served models",
                ok(ref("ModelList")),
                tag="client",
            )
        },
        "/health": {
            "get": operation(
                "/health",
                "llamaHealth",
                "Readiness, as llama.cpp's /health: 200 {status: ok} once a model is loaded "
                "and none is loading; 503 in llama.cpp's shape ({error: {code: 503, message, "
                'type: "unavailable_error"}}) while the server starts or a model loads '
                '("Loading model"), with nothing loaded ("No model loaded"), or while it '
                'drains for shutdown ("Shutting down")',
                ok(ref("LlamaHealth")),
                (503,),
                tag="client",
            )
        },
        "/v1/models/{model_id}": {
            # On the path item: every operation of the path (OPTIONS too) takes it.
            "parameters": [
                {
                    "name": "model_id",
                    "in": "path",
                    "required": True,
                    "description": "A served name or an alias (may contain '/').",
                    "schema": {"type": "string", "minLength": 1},
                }
            ],
            "get": operation(
                "/v1/models/{model_id}",
                "retrieveModel",
                "One served model: its /v1/models row. An alias stands for its target; an "
                "id that names no served model is 404 model_not_found (even with one loaded)",
                ok(ref("Model")),
                (404,),
                tag="client",
            ),
        },
    }


def add_debug_paths(paths: dict[str, dict]) -> None:
    """The test hook PANTHEON_DEBUG_ROUTES turns on."""
    paths[DEBUG_PATH] = {
        "post": operation(
            DEBUG_PATH,
            "simulateMemoryPressure",
            "Test hook (PANTHEON_DEBUG_ROUTES): pin a model's memory-pressure level",
            ok(
                obj(
                    {
                        "model": STRING,
                        "memory_pressure": STRING,
                        "simulated": BOOL,
                        "max_concurrent": NON_NEGATIVE,
                        "max_concurrent_configured": NON_NEGATIVE,
                        "context_window": NON_NEGATIVE,
                        "context_window_configured": NON_NEGATIVE,
                    },
                    ("model", "memory_pressure", "simulated"),
                )
            ),
            (400, 404, 503),
            body=obj(
                {
                    "model": nullable(STRING),
                    "level": {
                        "anyOf": [
                            {"enum": ["normal", "elevated", "high", "critical"]},
                            {"type": "integer", "minimum": 0, "maximum": 3},
                            {"type": "null"},
                        ]
                    },
                },
                additionalProperties=True,
            ),
            tag="operator",
        )
    }
