"""The model registry's maps and what reads them: which names are served by which live
service, each name's state, aliases and pins, and how a request's `model` routes.

`Registry` holds the state every operation shares; `Runtime` (lifecycle.py) adds loading
and unloading on top. The lock guards the maps and is held for microseconds: `resolve`
runs on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from engine import LoadProgress, ModelConfig
from pantheon_platform.runtime.errors import (
    Conflict,
    InvalidOption,
    ModelNotFound,
    NoModelsLoaded,
    NotFound,
    OperationFailed,
)
from pantheon_platform.runtime.load_spec import LoadSpec
from pantheon_platform.runtime.records import (
    FAILED,
    LOADED,
    LOADING,
    Instance,
    InstanceInfo,
    ModelState,
)
from pantheon_platform.runtime.store import Store

if TYPE_CHECKING:
    from engine import ModelService

log = logging.getLogger("pantheon.runtime")

MAX_ALIAS_DEPTH = 10  # links from an alias to a served name (the Lemonade rule)


class Registry:
    def __init__(self, store: Store | None = None) -> None:
        self._store = store or Store()
        # Guards the maps below; held for microseconds (resolve runs on the event loop).
        self._lock = threading.Lock()
        self._instances: dict[str, Instance] = {}
        self._states: dict[str, ModelState] = {}
        self._loading: dict[str, LoadSpec] = {}  # names reserved for a load, in order
        self._progress: dict[str, LoadProgress] = {}  # the latest report of each load
        self._aliases: dict[str, str] = {}
        self._ticks = itertools.count(1)
        # Event loops that routed requests: the unload barrier runs a no-op on each.
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._starting = False
        self._load_hooks: list[Callable[[str, ModelService], None]] = []
        self._unload_hooks: list[Callable[[str, ModelService], None]] = []
        self._progress_hooks: list[Callable[[str, LoadProgress], None]] = []

    def use_store(self, store: Store) -> None:
        """Persist through `store` from now on (pantheon_site.asgi, before start_loading)."""
        self._store = store

    def add_load_hook(self, fn: Callable[[str, ModelService], None]) -> None:
        """Call `fn(name, svc)` after every successful load (start-up and operator loads),
        once the service runs and before it is routable: a hook that restores state (the
        sessions app's spilled sessions) is done before the first request can arrive. Runs
        outside the registry lock; an exception is logged and the load still succeeds."""
        self._load_hooks.append(fn)

    def add_unload_hook(self, fn: Callable[[str, ModelService], None]) -> None:
        """Call `fn(name, svc)` when an unload or an eviction is about to free a service,
        after its generations drained (the sessions app spills its sessions, so that the
        next load of the name restores them). An exception is logged; the unload goes on."""
        self._unload_hooks.append(fn)

    def add_progress_hook(self, fn: Callable[[str, LoadProgress], None]) -> None:
        """Call `fn(name, progress)` on the loading thread after each step of a load, once
        the runtime has recorded it (loading() shows it). An exception is logged."""
        self._progress_hooks.append(fn)

    # --- pins and aliases -----------------------------------------------------------

    def set_pinned(self, name: str, pinned: bool) -> InstanceInfo:
        """Pinned models are never evicted to make room for another."""
        with self._lock:
            target = self._follow(name)
            instance = self._instances.get(target)
            if instance is None or instance.draining:
                raise NotFound(f"model {name!r} is not loaded")
        self._persist("the pin of", target, self._store.pinned, target, pinned)
        with self._lock:
            instance.pinned = pinned
        return self._info(target)

    def aliases(self) -> dict[str, str]:
        with self._lock:
            return dict(self._aliases)

    def follow(self, name: str) -> str:
        """The model name `name` stands for once aliases are followed."""
        with self._lock:
            return self._follow(name)

    def check_alias(self, alias: str, target: str) -> None:
        """OperatorError if `alias -> target` may not be set (the console validates first)."""
        with self._lock:
            self._check_alias(alias, target)

    def _check_alias(self, alias: str, target: str) -> None:
        if not alias.strip() or not target.strip():
            raise InvalidOption("alias and target must not be blank")
        if alias == target:
            raise InvalidOption(f"alias {alias!r} cannot point at itself")
        if alias in self._instances or alias in self._loading:
            raise Conflict(f"{alias!r} is already a loaded model's name")
        problem = _alias_chain_problem({**self._aliases, alias: target})
        if problem:
            raise Conflict(problem)

    def set_alias(self, alias: str, target: str) -> None:
        """Point `alias` at `target` (a model or another alias; it need not be loaded)."""
        with self._lock:
            self._check_alias(alias, target)
        self._persist("alias", alias, self._store.alias_set, alias, target)
        with self._lock:
            self._aliases[alias] = target

    def delete_alias(self, alias: str) -> None:
        with self._lock:
            if alias not in self._aliases:
                raise NotFound(f"no alias {alias!r}")
        self._persist("the deletion of alias", alias, self._store.alias_deleted, alias)
        with self._lock:
            self._aliases.pop(alias, None)

    @staticmethod
    def _persist(what: str, name: str, write, *args) -> None:
        """Run a store write; a failure leaves memory unchanged and is an OperationFailed."""
        try:
            write(*args)
        except Exception as exc:
            log.exception("cannot record %s %s", what, name)
            raise OperationFailed(f"cannot record {what} {name!r}: {exc}") from exc

    def _follow(self, name: str) -> str:
        """The name an alias (chain) stands for; any other name unchanged. Caller holds _lock."""
        for _ in range(MAX_ALIAS_DEPTH):
            if name not in self._aliases:
                break
            name = self._aliases[name]
        return name

    # --- registry ---------------------------------------------------------------------

    def register(self, name: str, svc: ModelService) -> None:
        """Serve an already-loaded service under `name` (tests that load the model once per
        session). The same service may be registered under two names."""
        config = getattr(svc, "config", None)
        if isinstance(config, ModelConfig):
            spec = LoadSpec(replace(config, name=name, path=str(svc.path)))
        else:  # routing tests register stand-ins
            spec = LoadSpec.of(name=name, path="")
        window = spec.config.ctx_cap or getattr(svc, "context_window_configured", 0)
        with self._lock:
            self._instances[name] = Instance(
                spec, svc, False, time.time(), next(self._ticks), window
            )
            self._states[name] = ModelState(LOADED)

    def unregister(self, name: str) -> ModelService | None:
        """Stop serving `name` at once, without draining; the caller owns the service."""
        with self._lock:
            self._states.pop(name, None)
            instance = self._instances.pop(name, None)
        return instance.svc if instance else None

    def services(self) -> dict[str, ModelService]:
        """What /v1/models lists: every routable name (an unloading one is not)."""
        with self._lock:
            return {n: i.svc for n, i in self._instances.items() if not i.draining}

    def states(self) -> dict[str, ModelState]:
        with self._lock:
            return dict(self._states)

    def instances(self) -> list[InstanceInfo]:
        """Every live instance, unloading ones included, by name."""
        with self._lock:
            names = sorted(self._instances)
        return [info for name in names if (info := self._info(name)) is not None]

    def instance(self, name: str) -> InstanceInfo | None:
        return self._info(name)

    def _info(self, name: str) -> InstanceInfo | None:
        with self._lock:
            i = self._instances.get(name)
            if i is None:
                return None
            aliases = tuple(sorted(a for a in self._aliases if self._follow(a) == name))
            return InstanceInfo(
                name, i.spec, i.svc, i.pinned, i.loaded_at, i.draining, aliases, i.window_configured
            )

    def resolve(self, model: str | None) -> tuple[str, ModelService]:
        """The (served name, service) a request's `model` routes to.

        An alias stands for its target. One loaded model: any value, or none, routes to
        it. Several: the exact name. A name being unloaded routes nowhere.
        """
        self._note_loop()
        with self._lock:
            name = self._follow(model) if model else model
            live = {n: i for n, i in self._instances.items() if not i.draining}
            instance = live.get(name) if name else None
            if instance is None and name in self._instances:
                raise ModelNotFound(f"model {name!r} is being unloaded")
            if instance is None and not live:
                raise NoModelsLoaded(_why_none_loaded(self._states, self._starting))
            if instance is None and len(live) == 1:
                instance = next(iter(live.values()))
            if instance is None:
                served = ", ".join(sorted(live))
                if not model:
                    raise ModelNotFound(
                        f"several models are loaded ({served}); name one in `model`"
                    )
                raise ModelNotFound(f"model {model!r} is not loaded; loaded models: {served}")
            instance.last_used = next(self._ticks)
            return instance.spec.name, instance.svc

    def _note_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        with self._lock:
            self._loops.add(loop)

    def close(self) -> None:
        """Close every service (once each, even if registered under several names)."""
        with self._lock:
            services = list({id(i.svc): i.svc for i in self._instances.values()}.values())
            self._instances.clear()
            self._states.clear()
        for svc in services:
            svc.close()


def _why_none_loaded(states: dict[str, ModelState], starting: bool = False) -> str:
    loading = sorted(name for name, s in states.items() if s.state == LOADING)
    failed = {name: s.error for name, s in states.items() if s.state == FAILED}
    if loading:
        return f"no models loaded yet: still loading {', '.join(loading)}; retry shortly"
    if starting:
        return "no models loaded yet: the server is starting; retry shortly"
    if failed:
        why = "; ".join(f"{name} failed to load ({error})" for name, error in failed.items())
        return f"no models loaded: {why}"
    return "no models loaded: none is configured (set PANTHEON_MODELS or load one)"


def _alias_chain_problem(aliases: dict[str, str]) -> str:
    """Why this alias map is not allowed (a cycle, or a chain past MAX_ALIAS_DEPTH), or ""."""
    for start in aliases:
        seen, name = [start], aliases[start]
        while name in aliases:
            if name in seen:
                return f"aliases would form a cycle: {' -> '.join([*seen, name])}"
            seen.append(name)
            name = aliases[name]
        if len(seen) > MAX_ALIAS_DEPTH:
            return f"alias chain from {start!r} would be {len(seen)} links deep (at most {MAX_ALIAS_DEPTH})"
    return ""
