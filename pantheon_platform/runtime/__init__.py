"""The one Django-side package that builds and holds engine objects: the model registry.

A process-wide `Runtime` holds the live model instances and everything an operator can
change while the server runs: load and unload (draining in-flight generations first),
aliases, pins and least-recently-used eviction under PANTHEON_MAX_LOADED_MODELS. It also
refuses what would hurt the host: files outside PANTHEON_MODEL_DIRS, and loads whose
estimated memory does not fit.

What must survive a restart goes through a `Store` (operators.store.DatabaseStore in the
server; the default remembers nothing). At start-up a background thread asks the store
which models to load and loads them one after the other, so GET / answers at once and
says what is loading. Views ask the runtime; they never construct engine objects, and
they read device facts here rather than from the kernels.

Modules: errors (the exceptions), load_spec (LoadSpec: the engine's ModelConfig as the
operator sent it, plus the pin), records (states and snapshots), store (the persistence
interface), registry (maps, routing, aliases, pins), admission (checks before a load),
lifecycle (Runtime: start-up, load, unload), devices (what the kernels say), django_settings
(what the runtime reads from settings), build (the build id). Import from here.
"""

from __future__ import annotations

from engine import POOLINGS
from pantheon_platform import live_settings
from pantheon_platform.runtime.build import build_id
from pantheon_platform.runtime.devices import (
    GRAPH_SUMMARY_KEYS,
    KV_DTYPES,
    MAX_DIES,
    DeviceFacts,
    backend_name,
    device_facts,
    dies_listing,
)
from pantheon_platform.runtime.django_settings import (
    configured_models,
    default_options,
    push_queue_limits,
)
from pantheon_platform.runtime.errors import (
    Conflict,
    InsufficientMemory,
    InvalidOption,
    ModelNotFound,
    NoModelsLoaded,
    NotFound,
    OperationFailed,
    OperatorError,
    PathNotAllowed,
)
from pantheon_platform.runtime.lifecycle import Runtime
from pantheon_platform.runtime.load_spec import (
    MAX_CHAT_TEMPLATE_BYTES,
    LoadSpec,
    configured_specs,
    resolve_chat_template,
)
from pantheon_platform.runtime.records import (
    FAILED,
    LOADED,
    LOADING,
    UNLOADING,
    InstanceInfo,
    LoadingInfo,
    ModelState,
    UnloadResult,
)
from pantheon_platform.runtime.registry import MAX_ALIAS_DEPTH
from pantheon_platform.runtime.store import Store

__all__ = [
    "FAILED",
    "GRAPH_SUMMARY_KEYS",
    "LOADED",
    "LOADING",
    "MAX_ALIAS_DEPTH",
    "MAX_CHAT_TEMPLATE_BYTES",
    "KV_DTYPES",
    "MAX_DIES",
    "POOLINGS",
    "UNLOADING",
    "Conflict",
    "DeviceFacts",
    "InstanceInfo",
    "InsufficientMemory",
    "InvalidOption",
    "LoadSpec",
    "LoadingInfo",
    "ModelNotFound",
    "ModelState",
    "NoModelsLoaded",
    "NotFound",
    "OperationFailed",
    "OperatorError",
    "PathNotAllowed",
    "Runtime",
    "Store",
    "UnloadResult",
    "backend_name",
    "build_id",
    "configured_models",
    "configured_specs",
    "default_options",
    "device_facts",
    "dies_listing",
    "get_runtime",
    "resolve_chat_template",
]

_runtime = Runtime()  # the process's registry; tests swap it (tests/conftest.py use_runtime)


def get_runtime() -> Runtime:
    """The process's model registry: the one way any module reaches it. Looked up per
    call (never bound at import), so a registry a test puts in place is the one every
    view, consumer and background task sees."""
    return _runtime


def _push_queue_limits(changed: set[str]) -> None:
    push_queue_limits(changed, get_runtime().instances())


live_settings.on_change(_push_queue_limits)
