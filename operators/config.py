"""Runtime config (GET / PATCH /admin/config): the live settings' document, the checks of
a change, and their store in the database.

The live settings themselves (their checks, defaults and the one accessor every read site
uses) are pantheon_platform.live_settings. Here: the settings that need a restart,
listed read-only so an operator sees the whole picture, and what a PATCH may say.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from operators.models import ConfigOverride
from pantheon_platform import live_settings
from pantheon_platform.errors import invalid_request


class DatabaseOverrides(live_settings.OverrideStore):
    def read(self) -> dict[str, Any]:
        return dict(ConfigOverride.objects.values_list("name", "value"))

    def write(self, changes: dict[str, Any]) -> None:
        with transaction.atomic():
            for name, value in changes.items():
                if value is None:
                    ConfigOverride.objects.filter(name=name).delete()
                else:
                    ConfigOverride.objects.update_or_create(name=name, defaults={"value": value})


def _engine(key: str):
    return lambda: settings.PANTHEON_ENGINE_OPTIONS.get(key)


def _model_default(key: str):
    return lambda: settings.PANTHEON_MODEL_DEFAULTS.get(key)


# Settings read once, at start-up or by each load's engine: (name, env, value, description).
# Shown so an operator sees them; a PATCH of one is refused (400: it needs a restart).
READ_ONLY = (
    ("backend", "PANTHEON_BACKEND", _engine("backend"), "Compute backend: auto, cpu, numpy, cuda."),
    ("threads", "PANTHEON_THREADS", lambda: settings.PANTHEON_THREADS, "Engine threads (0: auto)."),
    (
        "activations",
        "PANTHEON_ACTIVATIONS",
        lambda: settings.PANTHEON_ACTIVATIONS,
        "Decode products: float32, or bfloat16 (opt-in, AVX-512 BF16 CPUs).",
    ),
    (
        "prefill_chunk",
        "PANTHEON_PREFILL_CHUNK",
        _engine("prefill_chunk"),
        "Prompt tokens per engine step.",
    ),
    (
        "stream_interval_ms",
        "PANTHEON_STREAM_INTERVAL_MS",
        lambda: round(settings.PANTHEON_ENGINE_OPTIONS["stream_interval_s"] * 1000),
        "A stream's tokens leave at most this often (ms); faster ones join one chunk. 0: every step.",
    ),
    (
        "model_dirs",
        "PANTHEON_MODEL_DIRS",
        lambda: [str(p) for p in settings.PANTHEON_MODEL_DIRS],
        "Folders model files are loaded from.",
    ),
    ("ctx_cap", "PANTHEON_CTX_CAP", _model_default("ctx_cap"), "Default per-session context cap."),
    (
        "max_sessions",
        "PANTHEON_MAX_SESSIONS",
        _model_default("max_sessions"),
        "Default sessions holding KV per model.",
    ),
    (
        "max_concurrent",
        "PANTHEON_MAX_CONCURRENT",
        _model_default("max_concurrent"),
        "Default requests decoded at once per model (0: max_sessions).",
    ),
    (
        "speculation",
        "PANTHEON_SPECULATION",
        _engine("speculation"),
        "Exact speculative decoding: auto drafts tokens (from the context, a request's "
        "prediction and a model's draft_model) and verifies them in one pass, the same "
        "tokens; off never drafts.",
    ),
    (
        "weight_cache",
        "PANTHEON_WEIGHT_CACHE",
        lambda: bool(settings.PANTHEON_ENGINE_OPTIONS.get("weight_cache_dir")),
        "Prepared weights cached on disk for fast reloads.",
    ),
    (
        "session_idle_ttl_s",
        "PN_SESSION_IDLE_TTL_MS",
        _engine("session_idle_ttl_s"),
        "Seconds an idle session keeps its KV.",
    ),
    (
        "responses_implicit_ttl_s",
        "PANTHEON_RESPONSES_IMPLICIT_TTL_S",
        _engine("session_implicit_ttl_s"),
        "Seconds an idle implicit session (a Responses chain without a session id) keeps "
        "its KV; evicted first when an explicit session needs a slot.",
    ),
    ("max_watches", "PANTHEON_MAX_WATCHES", _engine("max_watches"), "Session watches per model."),
    (
        "max_messages",
        "PANTHEON_MAX_MESSAGES",
        lambda: settings.PANTHEON_MAX_MESSAGES,
        "Messages a chat request may hold.",
    ),
    (
        "max_tools",
        "PANTHEON_MAX_TOOLS",
        lambda: settings.PANTHEON_MAX_TOOLS,
        "Tools a chat request may offer.",
    ),
    (
        "responses_max_item_bytes",
        "PANTHEON_RESPONSES_MAX_ITEM_BYTES",
        lambda: settings.PANTHEON_RESPONSES_MAX_ITEM_BYTES,
        "Bytes of one stored response at most; a larger one is answered, not stored.",
    ),
    (
        "responses_max_bytes_per_key",
        "PANTHEON_RESPONSES_MAX_BYTES_PER_KEY",
        lambda: settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY,
        "Bytes of stored responses per API key; past it the key's oldest are evicted.",
    ),
    (
        "responses_max_per_key",
        "PANTHEON_RESPONSES_MAX_PER_KEY",
        lambda: settings.PANTHEON_RESPONSES_MAX_PER_KEY,
        "Stored responses per API key; past it the key's oldest are evicted.",
    ),
    (
        "responses_ttl_s",
        "PANTHEON_RESPONSES_TTL_S",
        lambda: settings.PANTHEON_RESPONSES_TTL_S,
        "Seconds a stored response is kept.",
    ),
    (
        "memory_reserve_mb",
        "PANTHEON_MEMORY_RESERVE_MB",
        lambda: settings.PANTHEON_MEMORY_RESERVE_BYTES // 2**20,
        "Memory a load must leave free beyond its estimate.",
    ),
)
_READ_ONLY_ENV = {name: env for name, env, _, _ in READ_ONLY}


def document() -> dict:
    """GET /admin/config: every setting by name, live ones first."""
    out: dict[str, dict] = {}
    for name, setting in live_settings.SETTINGS.items():
        out[name] = {
            "value": live_settings.value(name),
            "default": live_settings.default(name),
            "source": "database" if live_settings.overridden(name) else "environment",
            "mutable": True,
            "applies": setting.applies,
            "env": setting.env,
            "description": setting.description,
        }
    for name, env, read, description in READ_ONLY:
        out[name] = {
            "value": read(),
            "source": "environment",
            "mutable": False,
            "env": env,
            "description": description,
        }
    return {"object": "config", "settings": out}


def checked_changes(body: dict) -> dict[str, Any]:
    """A PATCH body as {name: value or None}, every field checked before any is stored:
    400 naming the first field at fault (unknown, read-only, or a value it does not take)."""
    if not body:
        raise invalid_request('no settings given; send {"name": value, ...}')
    changes = {}
    for name, raw in body.items():
        if name in _READ_ONLY_ENV:
            raise invalid_request(
                f"{name}: read-only while the server runs; set {_READ_ONLY_ENV[name]} and "
                "restart the server",
                param=name,
            )
        setting = live_settings.SETTINGS.get(name)
        if setting is None:
            raise invalid_request(
                f"{name}: no such setting; the settings that change without a restart are "
                f"{', '.join(live_settings.SETTINGS)}",
                param=name,
            )
        if raw is None:
            changes[name] = None  # back to the environment's value
            continue
        try:
            changes[name] = setting.check(raw)
        except live_settings.InvalidValue as exc:
            raise invalid_request(f"{name}: {exc}", param=name) from None
    return changes
