"""Settings an operator may change while the server runs (PATCH /admin/config), and the
one accessor code reads them through: `value(name)` is the stored override, else the
Django setting (the environment's value).

Overrides live in a `OverrideStore` (operators.config.DatabaseOverrides in the server;
this default remembers nothing). They are read into memory by `refresh()` (at start-up,
pantheon_site.asgi, and after every change), so `value()` never touches the database: it
is read on the event loop and in Twisted's thread (the access guard). One process holds
the snapshot; a change made through another process is seen at that one's next refresh.

`on_change(fn)` runs `fn(names)` after a refresh moved some values (the runtime pushes a
new queue depth into the loaded models; the log level is applied here). The engine never
imports this module: what it needs is passed in.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pantheon.config")

NEXT_REQUEST, NEXT_LOAD, NOW = "next request", "next load", "now"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# tool_grammar's values and the engine's ChatOptions.tool_grammar for each.
TOOL_GRAMMAR_MODES = {"required": None, "auto": True, "off": False}


class InvalidValue(ValueError):
    """A value a setting does not take; the message says what it takes."""


def _integer(low: int, high: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise InvalidValue(f"expected an integer from {low} to {high}")
        return v

    check.schema = {"type": "integer", "minimum": low, "maximum": high}
    return check


def _number(low: float, high: float) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        # An int is compared as it is: float() of a 400-digit one would overflow.
        in_range = isinstance(v, int | float) and not isinstance(v, bool) and low <= v <= high
        if not in_range or (isinstance(v, float) and not math.isfinite(v)):
            raise InvalidValue(f"expected a number from {low:g} to {high:g}")
        return float(v)

    check.schema = {"type": "number", "minimum": low, "maximum": high}
    return check


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in choices:
            raise InvalidValue(f"expected one of {', '.join(choices)}")
        return v

    check.schema = {"type": "string", "enum": list(choices)}
    return check


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise InvalidValue("expected true or false")
    return v


_boolean.schema = {"type": "boolean"}


@dataclass(frozen=True)
class LiveSetting:
    name: str
    env: str  # the environment variable its default comes from
    default: Callable[[Any], Any]  # django.conf.settings -> the value without an override
    # A JSON value -> the setting's value, or InvalidValue; its `schema` (JSON Schema of
    # what it takes) is the OpenAPI document's.
    check: Callable[[Any], Any]
    applies: str  # NEXT_REQUEST, NEXT_LOAD or NOW
    description: str


def _engine(key: str, fallback):
    return lambda s: getattr(s, "PANTHEON_ENGINE_OPTIONS", {}).get(key, fallback)


def _tool_grammar(s) -> str:
    setting = getattr(s, "PANTHEON_TOOL_GRAMMAR", None)
    return next(mode for mode, v in TOOL_GRAMMAR_MODES.items() if v is setting)


def _log_level(s) -> str:
    level = s.LOGGING.get("loggers", {}).get("pantheon", {}).get("level", "INFO")
    return level if level in LOG_LEVELS else "INFO"


SETTINGS: dict[str, LiveSetting] = {
    s.name: s
    for s in (
        LiveSetting(
            "queue_depth",
            "BS_QUEUE_DEPTH",
            _engine("queue_depth", 32),
            _integer(0, 100_000),
            NEXT_REQUEST,
            "Requests that may wait for a slot per model; one more gets 429 server_busy.",
        ),
        LiveSetting(
            "queue_timeout_s",
            "PANTHEON_QUEUE_TIMEOUT",
            _engine("queue_timeout_s", 30.0),
            _number(0.1, 86_400),
            NEXT_REQUEST,
            "Seconds a request may wait in the queue before it gets 429 server_busy.",
        ),
        LiveSetting(
            "max_loaded_models",
            "PANTHEON_MAX_LOADED_MODELS",
            lambda s: getattr(s, "PANTHEON_MAX_LOADED_MODELS", 4),
            _integer(1, 1000),
            NEXT_LOAD,
            "Models loaded at once; one more evicts the least recently used.",
        ),
        LiveSetting(
            "key_max_concurrent",
            "PANTHEON_KEY_MAX_CONCURRENT",
            lambda s: getattr(s, "PANTHEON_KEY_MAX_CONCURRENT", 0),
            _integer(0, 100_000),
            NEXT_REQUEST,
            "Requests one API key may have in flight (0: no limit); a console key's own "
            "limit overrides it.",
        ),
        LiveSetting(
            "reasoning_budget",
            "PANTHEON_REASONING_BUDGET",
            lambda s: getattr(s, "PANTHEON_MODEL_DEFAULTS", {}).get("reasoning_budget", 0),
            _integer(0, 1 << 24),
            NEXT_LOAD,
            "Reasoning tokens before a think block is closed, for loads that do not set "
            "reasoning_budget (0: unbounded).",
        ),
        LiveSetting(
            "tool_grammar",
            "PANTHEON_TOOL_GRAMMAR",
            _tool_grammar,
            _choice(*TOOL_GRAMMAR_MODES),
            NEXT_REQUEST,
            'Grammar-constrained tool calls: "required" (tool_choice required and named '
            'functions; PANTHEON_TOOL_GRAMMAR unset), "auto" (also auto, =1), "off" (=0).',
        ),
        LiveSetting(
            "no_think",
            "PANTHEON_NO_THINK",
            lambda s: bool(getattr(s, "PANTHEON_NO_THINK", False)),
            _boolean,
            NEXT_REQUEST,
            "Think-style templates: a request without enable_thinking does not think.",
        ),
        LiveSetting(
            "unload_timeout_s",
            "PANTHEON_UNLOAD_TIMEOUT",
            lambda s: float(getattr(s, "PANTHEON_UNLOAD_TIMEOUT", 120.0)),
            _number(0, 86_400),
            NEXT_REQUEST,
            "Seconds an unload waits for in-flight generations before it answers.",
        ),
        LiveSetting(
            "drain_timeout_s",
            "PANTHEON_DRAIN_TIMEOUT",
            lambda s: float(getattr(s, "PANTHEON_DRAIN_TIMEOUT", 30.0)),
            _number(0, 86_400),
            NEXT_REQUEST,
            "Seconds a graceful shutdown waits for in-flight generations.",
        ),
        LiveSetting(
            "log_level",
            "(settings.LOGGING)",
            _log_level,
            _choice(*LOG_LEVELS),
            NOW,
            "Level of the server log (the pantheon loggers; the access log is always on).",
        ),
    )
}


class OverrideStore:
    """Where overrides outlive the process. This default remembers nothing."""

    def read(self) -> dict[str, Any]:
        return {}

    def write(self, changes: dict[str, Any]) -> None:
        """Set each name to its value; None removes the override. One transaction."""


_store = OverrideStore()
_overrides: dict[str, Any] = {}  # the snapshot value() reads; replaced whole, never mutated
_write_lock = threading.Lock()
_hooks: list[Callable[[set[str]], None]] = []


def use_store(store: OverrideStore) -> None:
    """Keep overrides in `store` from now on (operators.apps); read by the next refresh."""
    global _store
    _store = store


def value(name: str) -> Any:
    """The live value of setting `name`: its override, else the Django setting."""
    overrides = _overrides
    if name in overrides:
        return overrides[name]
    from django.conf import settings

    return SETTINGS[name].default(settings)


def default(name: str) -> Any:
    from django.conf import settings

    return SETTINGS[name].default(settings)


def overridden(name: str) -> bool:
    return name in _overrides


def on_change(fn: Callable[[set[str]], None]) -> None:
    """Call `fn(names)` after a refresh changed the values of `names`."""
    _hooks.append(fn)


def refresh() -> None:
    """Read the overrides from the store (a sync context: start-up, an operator view). A
    stored value this version no longer accepts, or an unknown name, is ignored (logged).
    Unreadable (no migrations yet): the environment's values, said in the log."""
    try:
        stored = _store.read()
    except Exception as exc:
        log.warning("cannot read the runtime config overrides (%s); using the environment", exc)
        stored = {}
    kept = {}
    for name, raw in stored.items():
        setting = SETTINGS.get(name)
        try:
            if setting is None:
                raise InvalidValue("no such setting")
            kept[name] = setting.check(raw)
        except InvalidValue as exc:
            log.warning("ignoring the stored config override %s=%r: %s", name, raw, exc)
    _replace(kept)


def forget() -> None:
    """Drop the snapshot (tests: a fresh process, before its start-up refresh)."""
    _replace({})


def update(changes: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Store checked `changes` (None: back to the environment's value), refresh, and return
    {name: (old, new)} for the names given."""
    with _write_lock:
        before = {name: value(name) for name in changes}
        _store.write(changes)
        refresh()
        return {name: (before[name], value(name)) for name in changes}


def _replace(overrides: dict[str, Any]) -> None:
    global _overrides
    before = {name: value(name) for name in SETTINGS}
    _overrides = overrides
    changed = {name for name in SETTINGS if value(name) != before[name]}
    if not changed:
        return
    for fn in list(_hooks):
        try:
            fn(changed)
        except Exception:
            log.exception("applying changed settings %s failed", sorted(changed))


def _apply_log_level(changed: set[str]) -> None:
    if "log_level" in changed:
        logging.getLogger("pantheon").setLevel(value("log_level"))


on_change(_apply_log_level)
