"""The OpenAPI pieces of the operator routes (/admin/models, /admin/aliases, ...:
operators/urls.py). Request bodies are read from the serializers (operators/serializers.py);
pantheon_site/openapi.py puts the document together."""

from __future__ import annotations

from operators.serializers import NAME_MAX, AliasRequest, LoadRequest, NameRequest, PinRequest
from pantheon_platform import live_settings
from pantheon_platform.openapi import (
    ATTENTION,
    BOOL,
    GRAPHS,
    INT,
    LOAD_PROGRESS,
    NON_NEGATIVE,
    NUMBER,
    STRING,
    nullable,
    obj,
    ok,
    operation,
    ref,
    serializer_schema,
)

_INSTANCE = obj(
    {
        "id": STRING,
        "object": {"const": "model"},
        "status": {"type": "string", "enum": ["loaded", "unloading", "loading"]},
        "path": STRING,
        "architecture": STRING,
        "quantization": STRING,
        "weights_version": {"type": "string", "description": "Hash of the weights."},
        "created": INT,
        "loaded_at": INT,
        "dies": {"type": "array", "items": NON_NEGATIVE},
        "vram_bytes": NON_NEGATIVE,
        "host_bytes": NON_NEGATIVE,
        "max_sessions": NON_NEGATIVE,
        "max_concurrent": NON_NEGATIVE,
        "max_concurrent_configured": NON_NEGATIVE,
        "reasoning_budget": INT,
        "chat_template": {"type": "string", "enum": ["gguf", "custom"]},
        "quantize": BOOL,
        "pooling": {"enum": ["mean", "last", "cls"]},
        "kv_dtype": {"enum": ["f32", "f16", "q8_0"]},
        "kv_bytes_per_token": NON_NEGATIVE,
        "pinned": BOOL,
        "in_flight": NON_NEGATIVE,
        "aliases": {"type": "array", "items": STRING},
        "load_seconds": NUMBER,
        "weight_cache_used": BOOL,
        "kernel": {
            "type": "string",
            "enum": ["cpu", "numpy", "cuda", "xp"],
            "description": "cpu: compiled kernels; numpy: the float32 reference; cuda: the "
            "GPU backend on CUDA dies; xp: its array code on numpy (host dies, tests only)",
        },
        "kernel_isa": STRING,
        "kernel_activations": {
            "type": "string",
            "enum": ["float32", "bfloat16"],
            "description": "what the decode products round activations to (cpu only)",
        },
        "kernel_fallback": {
            "type": "object",
            "description": "tensor type -> tensors dequantised to float32 (no kernel)",
            "additionalProperties": NON_NEGATIVE,
        },
        "context_window": {"type": "integer", "minimum": 1},
        "context_window_configured": {"type": "integer", "minimum": 1},
        "speculation": obj(
            {
                "mode": {"type": "string", "enum": ["auto", "off"]},
                "drafted_tokens": NON_NEGATIVE,
                "accepted_tokens": NON_NEGATIVE,
                "acceptance_rate": {
                    **nullable({"type": "number", "minimum": 0, "maximum": 1}),
                    "description": "accepted / drafted since the load; null before any draft",
                },
                "draft_model": nullable(
                    obj(
                        {
                            "path": STRING,
                            "architecture": STRING,
                            "drafted_tokens": NON_NEGATIVE,
                            "accepted_tokens": NON_NEGATIVE,
                            "acceptance_rate": nullable(
                                {"type": "number", "minimum": 0, "maximum": 1}
                            ),
                        },
                        ("path", "architecture", "drafted_tokens", "accepted_tokens"),
                        description="The draft model (the draft_model load option): its "
                        "share of the drafts; null without one.",
                    )
                ),
            },
            ("mode", "drafted_tokens", "accepted_tokens", "acceptance_rate", "draft_model"),
            description="Exact speculative decoding (PANTHEON_SPECULATION).",
        ),
        "graphs": obj(
            {
                **GRAPHS["properties"],
                "gave_up": NON_NEGATIVE,
                "captures": NON_NEGATIVE,
                "capture_failures": NON_NEGATIVE,
                "segment": {**GRAPHS, "description": "The per-die full-step graphs."},
            },
            GRAPHS["required"],
        ),
        "attention": obj(
            {
                **ATTENTION["properties"],
                "gave_up": NON_NEGATIVE,
                "impossible": NON_NEGATIVE,
                "host_engagements": NON_NEGATIVE,
                "ring_alloc_failures": NON_NEGATIVE,
                "reasons": {
                    "type": "object",
                    "description": "Present when host > 0: why layers attend on the host.",
                    "additionalProperties": NON_NEGATIVE,
                },
            },
            ATTENTION["required"],
        ),
        "progress": {**LOAD_PROGRESS, "description": "While status is loading."},
    },
    (
        "id",
        "object",
        "status",
        "path",
        "dies",
        "vram_bytes",
        "max_sessions",
        "max_concurrent",
        "max_concurrent_configured",
        "pinned",
    ),
)

_AVAILABLE = obj(
    {
        "path": STRING,
        "name": STRING,
        "size_bytes": NON_NEGATIVE,
        "architecture": STRING,
        "quantization": STRING,
        "n_params": NON_NEGATIVE,
        "context_length": nullable(NON_NEGATIVE),
        "error": {"type": "string", "description": "Present when the file cannot be read."},
        "loaded": BOOL,
        "loaded_as": {"type": "array", "items": STRING},
        "source": {
            "type": "string",
            "enum": ["ollama", "lmstudio", "huggingface"],
            "description": "A model already on disk (PANTHEON_DISCOVER): whose store; "
            "`name` is the name it serves under.",
        },
    },
    ("path", "name", "size_bytes", "loaded", "loaded_as"),
)

_DIES = obj(
    {
        "object": {"const": "list"},
        "n_dies": NON_NEGATIVE,
        "data": {
            "type": "array",
            "items": obj(
                {
                    "die": NON_NEGATIVE,
                    "card": NON_NEGATIVE,
                    "model": STRING,
                    "n_models": NON_NEGATIVE,
                    "vram_budget": NON_NEGATIVE,
                    "vram_used": NON_NEGATIVE,
                },
                ("die", "card", "model", "n_models", "vram_budget", "vram_used"),
            ),
        },
    },
    ("object", "n_dies", "data"),
)


_SETTING = obj(
    {
        "value": {"description": "What the server uses now."},
        "default": {"description": "The environment's value (live settings only)."},
        "source": {"type": "string", "enum": ["environment", "database"]},
        "mutable": BOOL,
        "applies": {"type": "string", "enum": ["next request", "next load", "now"]},
        "env": STRING,
        "description": STRING,
    },
    ("value", "source", "mutable", "env", "description"),
)


def _config_patch() -> dict:
    """PATCH /admin/config's body: live settings, each its value or null (reset)."""
    return obj(
        {name: nullable(s.check.schema) for name, s in live_settings.SETTINGS.items()},
        minProperties=1,
        additionalProperties=False,
        description="Live settings to change; null: back to the environment's value. An "
        "unknown or read-only name, or a value out of range, is a 400 naming it.",
    )


def schemas() -> dict:
    return {
        "Config": obj(
            {
                "object": {"const": "config"},
                "settings": {"type": "object", "additionalProperties": _SETTING},
            },
            ("object", "settings"),
        ),
        "ConfigPatch": _config_patch(),
        "Instance": _INSTANCE,
        "InstanceList": obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Instance")}},
            ("object", "data"),
        ),
        "AvailableList": obj(
            {"object": {"const": "list"}, "data": {"type": "array", "items": _AVAILABLE}},
            ("object", "data"),
        ),
        "DieList": _DIES,
        "LoadRequest": serializer_schema(LoadRequest, additionalProperties=True),
        "AliasList": obj(
            {
                "object": {"const": "list"},
                "data": {
                    "type": "array",
                    "items": obj(
                        {
                            "alias": STRING,
                            "target": STRING,
                            "resolves_to": nullable(STRING),
                            "loaded": BOOL,
                        },
                        ("alias", "target", "resolves_to", "loaded"),
                    ),
                },
            },
            ("object", "data"),
        ),
    }


def add_paths(paths: dict[str, dict]) -> None:
    paths.update(
        {
            "/admin/models": {
                "get": operation(
                    "/admin/models",
                    "listInstances",
                    "Every live instance, operator fields; models loading, with progress",
                    ok(ref("InstanceList")),
                    tag="operator",
                )
            },
            "/admin/models/load": {
                "post": operation(
                    "/admin/models/load",
                    "loadModel",
                    "Load a model (one load at a time)",
                    ok(ref("Instance")),
                    (400, 404, 409, 507),
                    body=ref("LoadRequest"),
                    tag="operator",
                )
            },
            "/admin/models/unload": {
                "post": operation(
                    "/admin/models/unload",
                    "unloadModel",
                    "Unload a model once its in-flight generations finish",
                    ok(
                        obj(
                            {"unloaded": STRING, "drained": BOOL, "in_flight": NON_NEGATIVE},
                            ("unloaded", "drained"),
                        )
                    ),
                    (400, 404, 409),
                    body=serializer_schema(NameRequest, additionalProperties=True),
                    tag="operator",
                )
            },
            "/admin/models/pin": {
                "post": operation(
                    "/admin/models/pin",
                    "pinModel",
                    "Pin a model (never evicted) or unpin it",
                    ok(obj({"name": STRING, "pinned": BOOL}, ("name", "pinned"))),
                    (400, 404, 409),
                    body=serializer_schema(PinRequest, additionalProperties=True),
                    tag="operator",
                )
            },
            "/admin/models/available": {
                "get": operation(
                    "/admin/models/available",
                    "listAvailableModels",
                    "The GGUF files under PANTHEON_MODEL_DIRS",
                    ok(ref("AvailableList")),
                    tag="operator",
                )
            },
            "/admin/dies": {
                "get": operation(
                    "/admin/dies",
                    "listDies",
                    "Accelerator dies and their memory",
                    ok(ref("DieList")),
                    tag="operator",
                )
            },
            "/admin/aliases": {
                "get": operation(
                    "/admin/aliases",
                    "listAliases",
                    "Aliases and what they resolve to",
                    ok(ref("AliasList")),
                    tag="operator",
                ),
                "post": operation(
                    "/admin/aliases",
                    "setAlias",
                    "Create or move an alias",
                    ok(obj({"alias": STRING, "target": STRING}, ("alias", "target"))),
                    (400, 404, 409),
                    body=serializer_schema(
                        AliasRequest,
                        additionalProperties=True,
                        description="`target` (or `model`) is required.",
                        anyOf=[{"required": ["target"]}, {"required": ["model"]}],
                    ),
                    tag="operator",
                ),
            },
            "/admin/config": {
                "get": operation(
                    "/admin/config",
                    "getConfig",
                    "Every setting: the live ones (value, default, source) and read-only ones",
                    ok(ref("Config")),
                    tag="operator",
                ),
                "patch": operation(
                    "/admin/config",
                    "patchConfig",
                    "Change live settings (stored; in effect for the next request)",
                    ok(ref("Config")),
                    (400,),
                    body=ref("ConfigPatch"),
                    tag="operator",
                ),
            },
            "/admin/shutdown": {"post": _shutdown()},
            "/admin/aliases/{alias}": {
                # On the path item: every operation of the path (OPTIONS too) takes it.
                "parameters": [
                    {
                        "name": "alias",
                        "in": "path",
                        "required": True,
                        "description": "May contain '/'.",
                        "schema": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
                    }
                ],
                "delete": operation(
                    "/admin/aliases/{alias}",
                    "deleteAlias",
                    "Delete an alias",
                    ok(obj({"deleted": STRING}, ("deleted",))),
                    (400, 404),
                    tag="operator",
                ),
            },
        }
    )


def _shutdown() -> dict:
    op = operation(
        "/admin/shutdown",
        "shutdownServer",
        "Graceful shutdown, as SIGTERM: stop admitting, drain, exit 0",
        ok(
            obj(
                {
                    "shutting_down": {"const": True},
                    "in_flight": NON_NEGATIVE,
                    "drain_timeout_s": NUMBER,
                },
                ("shutting_down", "in_flight", "drain_timeout_s"),
            ),
            "Accepted: the drain has begun",
        ),
        (503,),
        tag="operator",
    )
    op["responses"]["202"] = op["responses"].pop("200")
    return op
