"""The one Django-side module that builds and holds engine objects: the model registry.

A process-wide `runtime` holds the live model instances and everything an operator can
change while the server runs: load and unload (draining in-flight generations first),
aliases, pins and least-recently-used eviction under PANTHEON_MAX_LOADED_MODELS. It also
refuses what would hurt the host: files outside PANTHEON_MODEL_DIRS, and loads whose
estimated memory does not fit.

What must survive a restart goes through a `Store` (operators.store.DatabaseStore in the
server; the default remembers nothing). At start-up a background thread asks the store
which models to load and loads them one after the other, so GET / answers at once and
says what is loading. Views ask the runtime; they never construct engine objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

import kernels
import kernels.devices.dies
from engine import POOLINGS, LoadProgress, ModelConfig
from pantheon_platform import live_settings
from pantheon_platform.model_files import (
    ModelFileInfo,
    allowed_model_path,
    is_file,
    model_file_info,
)

if TYPE_CHECKING:
    from engine import ModelService

log = logging.getLogger("pantheon.runtime")

LOADING, LOADED, FAILED, UNLOADING = "loading", "loaded", "failed", "unloading"
MAX_ALIAS_DEPTH = 10  # links from an alias to a served name (the Lemonade rule)
MAX_DIES = 8  # the contract's PN_MODEL_MAX_DIES
MAX_CHAT_TEMPLATE_BYTES = 1 << 20  # a `chat_template` load option, inline or a file


class NoModelsLoaded(Exception):
    """Nothing can serve a completion yet (still loading, load failed, or none configured)."""


class ModelNotFound(Exception):
    """Several models are loaded and the request's `model` names none of them."""


# Operator refusals. The operator routes map each class onto a status code.
class OperatorError(Exception):
    pass


class InvalidOption(OperatorError):
    """The request cannot be honoured by this server (400)."""


class PathNotAllowed(OperatorError):
    """The file is outside PANTHEON_MODEL_DIRS (403)."""


class NotFound(OperatorError):
    """No such file, loaded model or alias (404)."""


class Conflict(OperatorError):
    """Already loaded / loading / unloading, nothing evictable, alias clash (409)."""


class InsufficientMemory(OperatorError):
    """Admission: the estimate does not fit in the free memory (507)."""


class OperationFailed(OperatorError):
    """Anything else went wrong (500)."""


@dataclass(frozen=True)
class ModelState:
    state: str  # LOADING | LOADED | FAILED | UNLOADING
    error: str = ""


@dataclass(frozen=True)
class LoadSpec:
    """Everything an operator asked for when loading a model (zero = engine default)."""

    name: str
    path: str
    ctx_cap: int = 0
    max_sessions: int = 4
    max_concurrent: int = 0
    reasoning_budget: int = 0
    dies: tuple[int, ...] = ()
    quantize: bool = False
    pinned: bool = False
    # As sent: a template's text, or a file in a model folder (read again at each load).
    chat_template: str = ""
    pooling: str = ""  # /v1/embeddings: mean, last or cls ("": the architecture's default)

    @classmethod
    def from_config(cls, cfg: ModelConfig, **extra) -> LoadSpec:
        return cls(
            name=cfg.name,
            path=cfg.path,
            ctx_cap=cfg.ctx_cap,
            max_sessions=cfg.max_sessions,
            max_concurrent=cfg.max_concurrent,
            reasoning_budget=cfg.reasoning_budget,
            chat_template=cfg.chat_template,
            pooling=cfg.pooling,
            **extra,
        )

    def engine_config(self) -> ModelConfig:
        """The engine's config: these options plus settings.PANTHEON_ENGINE_OPTIONS (the
        ones every model shares; the queue's from the runtime config), keeping only what
        this engine's ModelConfig knows."""
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        shared = {k: v for k, v in _setting("PANTHEON_ENGINE_OPTIONS", {}).items() if k in known}
        shared.update(_queue_limits())
        return ModelConfig(
            name=self.name,
            path=self.path,
            ctx_cap=self.ctx_cap,
            max_sessions=self.max_sessions,
            max_concurrent=self.max_concurrent,
            reasoning_budget=self.reasoning_budget,
            chat_template=resolve_chat_template(self.chat_template),
            quantize=self.quantize,
            pooling=self.pooling,
            dies=self.dies,
            **shared,
        )


@dataclass
class _Instance:
    spec: LoadSpec
    svc: ModelService
    pinned: bool
    loaded_at: float  # wall clock, for people
    last_used: int  # registry tick, for LRU: higher is more recent
    # What ctx_cap asked for, 0 resolved to the engine default: the served window may be
    # smaller (the model's trained length, a memory clamp).
    window_configured: int
    draining: bool = False


@dataclass(frozen=True)
class InstanceInfo:
    """A snapshot of one live instance for the operator views (svc fields are live)."""

    name: str
    spec: LoadSpec
    svc: ModelService
    pinned: bool
    loaded_at: float
    draining: bool
    aliases: tuple[str, ...]
    context_window_configured: int  # equal to svc.context_window unless it was clamped


@dataclass(frozen=True)
class LoadingInfo:
    """A model being loaded: what was asked, and how far its load has got (None until
    its load has started: start-up loads wait for the one before)."""

    name: str
    spec: LoadSpec
    progress: LoadProgress | None


@dataclass(frozen=True)
class UnloadResult:
    name: str
    drained: bool  # False: generations still ran at the timeout; freed when they end
    in_flight: int = 0


class Store:
    """Where the registry keeps what must outlive the process. This default remembers
    nothing: every start loads settings.PANTHEON_MODELS. Each call is one transaction."""

    def startup(self, seed: list[LoadSpec]) -> tuple[list[LoadSpec], dict[str, str]]:
        """The models to load at start (in order) and the aliases; `seed` fills an empty store."""
        return seed, {}

    def loaded(self, spec: LoadSpec) -> None:
        pass

    def unloaded(self, name: str) -> None:
        pass

    def failed(self, spec: LoadSpec, error: str) -> None:
        pass

    def pinned(self, name: str, pinned: bool) -> None:
        pass

    def alias_set(self, alias: str, target: str) -> None:
        pass

    def alias_deleted(self, alias: str) -> None:
        pass


class Runtime:
    def __init__(self, store: Store | None = None) -> None:
        self._store = store or Store()
        # Guards the maps below; held for microseconds (resolve runs on the event loop).
        self._lock = threading.Lock()
        # One load at a time: two dequantisations at once could together exhaust memory
        # that each alone was admitted to.
        self._load_lock = threading.Lock()
        self._instances: dict[str, _Instance] = {}
        self._states: dict[str, ModelState] = {}
        self._loading: dict[str, LoadSpec] = {}  # names reserved for a load, in order
        self._progress: dict[str, LoadProgress] = {}  # the latest report of each load
        self._aliases: dict[str, str] = {}
        self._ticks = itertools.count(1)
        # Event loops that routed requests: the unload barrier runs a no-op on each.
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        self._starting = False
        self._loader: threading.Thread | None = None
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

    # --- start-up -----------------------------------------------------------------------

    def start_loading(self, configs: Iterable[ModelConfig | LoadSpec] | None = None) -> None:
        """Load `configs` (default: what the store says was loaded, seeded from
        settings.PANTHEON_MODELS) in a background thread, one after the other.

        Idempotent: only the first call starts a loader. Returns at once; GET / reports
        progress while the weights load.
        """
        with self._lock:
            if self._loader is not None:
                return
            specs = None if configs is None else [_as_spec(c) for c in configs]
            if specs is None:
                self._starting = True  # until the loader has read the store
            else:
                specs = self._reserve_all(specs)
            # Daemon: a Ctrl-C during a long load must not wait for it.
            self._loader = threading.Thread(
                target=self._startup, args=(specs,), name="pantheon-loader", daemon=True
            )
            self._loader.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the loader thread is done (for scripts and tests)."""
        loader = self._loader
        if loader is None:
            return True
        loader.join(timeout)
        return not loader.is_alive()

    def _startup(self, specs: list[LoadSpec] | None) -> None:
        try:
            if specs is None:
                specs = self._read_store()
            for spec in specs:
                self._load_one(spec)
        finally:
            # This thread may have opened database connections (the store); nobody else
            # will ever close them.
            from django.db import connections

            connections.close_all()

    def _read_store(self) -> list[LoadSpec]:
        seed = configured_specs()
        try:
            specs, aliases = self._store.startup(seed)
        except Exception:  # e.g. migrations not applied: serve the environment's models
            log.exception("cannot read the model store; loading PANTHEON_MODELS instead")
            specs, aliases = seed, {}
        with self._lock:
            self._aliases.update(aliases)
            specs = self._reserve_all(specs)
            self._starting = False
        return specs

    def _reserve_all(self, specs: list[LoadSpec]) -> list[LoadSpec]:
        """Mark start-up names as loading (GET / shows them at once). Caller holds _lock."""
        kept = []
        for spec in specs:
            if spec.name in self._loading or spec.name in self._instances:
                log.error("model %s is listed twice; loading it once", spec.name)
                continue
            self._loading[spec.name] = spec
            self._states[spec.name] = ModelState(LOADING)
            kept.append(spec)
        return kept

    def _load_one(self, spec: LoadSpec) -> None:
        """A start-up load: a failure is logged, shown by GET /, and does not stop the others."""
        try:
            self._load_reserved(spec)
        except Exception as exc:
            with self._lock:
                self._states[spec.name] = ModelState(FAILED, _describe(exc))

    # --- load -------------------------------------------------------------------------

    def load(self, spec: LoadSpec) -> InstanceInfo:
        """Load a model now (blocking; waits for any load in progress). Raises an
        OperatorError subclass saying why not."""
        with self._lock:
            self._check_name_free(spec.name)
            self._loading[spec.name] = spec
            previous = self._states.get(spec.name)
            self._states[spec.name] = ModelState(LOADING)
        try:
            return self._load_reserved(spec)
        except BaseException:
            with self._lock:
                if previous is None:
                    self._states.pop(spec.name, None)
                else:  # e.g. it had failed at start: GET / keeps saying so
                    self._states[spec.name] = previous
            raise

    def checked_spec(self, spec: LoadSpec) -> LoadSpec:
        """`spec` with its path resolved inside the model folders, or an OperatorError."""
        if not spec.name.strip():
            raise InvalidOption("the model name must not be blank")
        if len(spec.dies) > MAX_DIES:
            raise InvalidOption(f"at most {MAX_DIES} dies per model; got {len(spec.dies)}")
        if spec.dies:
            if kernels.dies_visible() == 0:
                raise InvalidOption(
                    f"dies {list(spec.dies)} named, but this server has no accelerator dies "
                    f"(backend {kernels.backend_name()}); omit `dies`"
                )
            try:
                kernels.devices.dies.manager().get(spec.dies)
            except ValueError as exc:
                raise InvalidOption(f"dies: {exc}") from None
            if spec.quantize:
                raise InvalidOption(
                    "quantize is for the compiled CPU kernels; a model on dies computes on "
                    "its file's blocks as they are: omit `quantize` or `dies`"
                )
        elif spec.quantize and kernels.kernel_name(spec.engine_config().backend) != "cpu":
            raise InvalidOption(
                "quantize needs the compiled CPU kernels, and this server runs the float32 "
                "numpy engine (PANTHEON_BACKEND, or the kernels were not built); omit "
                "`quantize` or send false"
            )
        if spec.pooling and spec.pooling not in POOLINGS:
            raise InvalidOption(f"pooling: expected one of {', '.join(POOLINGS)}")
        try:
            checked = replace(spec, path=str(allowed_model_path(spec.path)))
        except PermissionError as exc:
            raise PathNotAllowed(str(exc)) from None
        resolve_chat_template(spec.chat_template)  # refuse a bad one before loading
        return checked

    def _check_name_free(self, name: str) -> None:
        """Caller holds _lock."""
        if name in self._loading:
            raise Conflict(f"model {name!r} is already loading")
        instance = self._instances.get(name)
        if instance is not None and instance.draining:
            raise Conflict(f"model {name!r} is still unloading; retry once it is gone")
        if instance is not None:
            raise Conflict(f"model {name!r} is already loaded")
        if name in self._aliases:
            raise Conflict(
                f"{name!r} is an alias for {self._aliases[name]!r}; delete the alias first"
            )

    def _load_reserved(self, spec: LoadSpec) -> InstanceInfo:
        """Admit, evict if needed, load and register `spec`, whose name is reserved.
        A failure is logged and recorded as the model's last error."""
        try:
            spec = self.checked_spec(spec)  # start-up specs come unchecked from the store
            with self._lock:
                self._loading[spec.name] = spec  # the loading row shows the file it reads
            with self._load_lock:
                info = _file_info(spec.path)
                victims = self._victims_for_one_more()
                self._admit(spec, info, victims)
                for victim in victims:
                    log.info("evicting %s (least recently used) to load %s", victim, spec.name)
                    self.unload(victim, reason="evicted")
                svc = self._open(spec)
                _test_load_delay(spec.name)
                try:
                    self._persist("the load of", spec.name, self._store.loaded, spec)
                except OperationFailed:
                    svc.close()
                    raise
                self._run_load_hooks(spec.name, svc)
                # What the operator asked for (the contract's *_configured), else the default.
                window = spec.ctx_cap or info.context(0)
                with self._lock:
                    self._instances[spec.name] = _Instance(
                        spec, svc, spec.pinned, time.time(), next(self._ticks), window
                    )
                    self._states[spec.name] = ModelState(LOADED)
                return self._info(spec.name)
        except Exception as exc:
            log.error("model %s failed to load: %s", spec.name, _describe(exc))
            try:
                self._store.failed(spec, _describe(exc))
            except Exception:
                log.exception("cannot record the failed load of %s", spec.name)
            raise
        finally:
            with self._lock:
                self._loading.pop(spec.name, None)
                self._progress.pop(spec.name, None)

    def _run_load_hooks(self, name: str, svc: ModelService) -> None:
        for fn in list(self._load_hooks):
            try:
                fn(name, svc)
            except Exception:
                log.exception("a load hook failed for model %s (the model is loaded)", name)

    def _open(self, spec: LoadSpec) -> ModelService:
        from engine import ModelFileNotFound, ModelLoadError, ModelService

        log.info("loading model %s from %s", spec.name, spec.path)
        started = time.monotonic()
        config = spec.engine_config()  # a refusal here (chat_template) is the operator's
        try:
            svc = ModelService.load(config, lambda p: self._note_progress(spec.name, p))
        except ModelFileNotFound as exc:
            raise NotFound(str(exc)) from exc
        except ModelLoadError as exc:
            raise OperationFailed(str(exc)) from exc
        except Exception as exc:
            log.exception("model %s failed to load", spec.name)
            raise OperationFailed(f"{type(exc).__name__}: {exc}") from exc
        log.info(
            "loaded model %s in %.1f s (%s, context window %d, kernel %s%s)",
            spec.name,
            time.monotonic() - started,
            svc.architecture,
            svc.context_window,
            svc.kernel,
            f", dies {svc.dies}" if svc.dies else "",
        )
        return svc

    def _note_progress(self, name: str, progress: LoadProgress) -> None:
        with self._lock:
            self._progress[name] = progress
        for fn in list(self._progress_hooks):
            try:
                fn(name, progress)
            except Exception:
                log.exception("a progress hook failed for model %s", name)

    def loading(self) -> list[LoadingInfo]:
        """The models being loaded (or waiting for their turn at start-up), in load order."""
        with self._lock:
            return [
                LoadingInfo(name, spec, self._progress.get(name))
                for name, spec in self._loading.items()
            ]

    def _victims_for_one_more(self) -> list[str]:
        """Least-recently-used unpinned idle models to unload so one more fits under
        PANTHEON_MAX_LOADED_MODELS; Conflict when only pinned or busy ones remain."""
        limit = live_settings.value("max_loaded_models")
        with self._lock:
            live = [i for i in self._instances.values() if not i.draining]
        excess = len(live) - limit + 1
        if excess <= 0:
            return []
        candidates = sorted(
            (i for i in live if not i.pinned and i.svc.in_flight == 0),
            key=lambda i: i.last_used,
        )
        if len(candidates) < excess:
            why = ", ".join(
                f"{i.spec.name} ({'pinned' if i.pinned else f'busy: {i.svc.in_flight} in flight'})"
                for i in sorted(live, key=lambda i: i.spec.name)
                if i not in candidates
            )
            raise Conflict(
                f"{len(live)} models are loaded (PANTHEON_MAX_LOADED_MODELS={limit}) and none "
                f"can be evicted: {why}; unpin or unload one first"
            )
        return [i.spec.name for i in candidates[:excess]]

    def _admit(self, spec: LoadSpec, info: ModelFileInfo, victims: list[str]) -> None:
        placed = _placement(spec)
        if placed:
            self._admit_on_dies(spec, info, placed, victims)
            return
        try:
            kernel = kernels.get_backend(spec.engine_config().backend).name
        except ValueError:  # refused again, clearly, by the load itself
            kernel = "numpy"
        need = info.estimate_bytes(spec.ctx_cap, spec.max_sessions, kernel)
        with self._lock:
            freed = sum(self._instances[v].svc.memory_bytes for v in victims)
        reserve = _setting("PANTHEON_MEMORY_RESERVE_BYTES", 0)
        free = psutil.virtual_memory().available + freed - reserve
        if need > free:
            raise InsufficientMemory(
                f"not enough memory to load {spec.name!r}: it needs about {need} bytes "
                f"({_gib(need)}: {kernel} weights plus float32 KV for {spec.max_sessions} sessions of "
                f"{info.context(spec.ctx_cap)} tokens) but {max(free, 0)} bytes "
                f"({_gib(max(free, 0))}) are free after the {reserve}-byte reserve; "
                f"lower ctx_cap or max_sessions, or unload a model"
            )

    def _admit_on_dies(self, spec: LoadSpec, info: ModelFileInfo, dies: list, victims) -> None:
        """Admission on dies: each die takes its share of the layers (weights as the file's
        blocks plus their KV) and must have it free in its budget (total minus
        PN_DIE_RESERVE_BYTES) beside what our allocations already hold there."""
        need = info.estimate_bytes(spec.ctx_cap, spec.max_concurrent or spec.max_sessions, "cpu")
        share = -(-need // len(dies))
        with self._lock:
            leaving = [self._instances[v].svc for v in victims]
        for die in dies:
            freed = sum(
                svc.memory_bytes // len(svc.dies) for svc in leaving if die.ordinal in svc.dies
            )
            free = die.free + freed
            if share > free:
                raise InsufficientMemory(
                    f"not enough memory on die {die.ordinal} to load {spec.name!r}: its share "
                    f"of the layers needs about {share} bytes ({_gib(share)}: the file's blocks "
                    f"plus float32 KV for {spec.max_concurrent or spec.max_sessions} slots of "
                    f"{info.context(spec.ctx_cap)} tokens, split across {len(dies)} dies) but "
                    f"{max(free, 0)} bytes ({_gib(max(free, 0))}) of the die's "
                    f"{die.budget}-byte budget are free; lower ctx_cap or max_sessions, name "
                    f"more dies, or unload a model"
                )

    # --- unload -----------------------------------------------------------------------

    def unload(self, name: str, *, timeout: float | None = None, reason: str = "") -> UnloadResult:
        """Stop routing `name` at once, wait for its generations to finish, then free it.

        Never cuts a generation off: past `timeout` (default PANTHEON_UNLOAD_TIMEOUT) the
        drain goes on in the background and the result says `drained=False`.
        """
        with self._lock:
            target = self._follow(name)
            instance = self._instances.get(target)
            if instance is None:
                if target in self._loading:
                    raise Conflict(f"model {target!r} is still loading; unload it once loaded")
                failed = self._states.get(target)
                if failed is None or failed.state != FAILED:
                    raise NotFound(f"model {name!r} is not loaded")
            elif instance.draining:
                raise Conflict(f"model {target!r} is already unloading")
            else:
                instance.draining = True  # from here on it routes no new request
                self._states[target] = ModelState(UNLOADING)
        try:
            self._persist("the unload of", target, self._store.unloaded, target)
        except OperationFailed:
            with self._lock:
                if instance is not None:  # still loaded: route to it again
                    instance.draining = False
                    self._states[target] = ModelState(LOADED)
            raise
        if instance is None:  # a start-up load had failed: forget it
            with self._lock:
                self._states.pop(target, None)
            return UnloadResult(target, drained=True)
        log.info("unloading %s%s", target, f" ({reason})" if reason else "")
        if timeout is None:
            timeout = live_settings.value("unload_timeout_s")
        if self._drain(instance, timeout):
            self._free(instance)
            return UnloadResult(target, drained=True)
        in_flight = instance.svc.in_flight
        log.warning(
            "%s: %d generation(s) still running; freeing it when they end", target, in_flight
        )
        threading.Thread(
            target=self._drain_then_free, args=(instance,), name=f"drain-{target}", daemon=True
        ).start()
        return UnloadResult(target, drained=False, in_flight=in_flight)

    def _drain(self, instance: _Instance, timeout: float) -> bool:
        self._barrier()
        deadline = time.monotonic() + timeout
        while instance.svc.in_flight:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _barrier(self) -> None:
        """Wait until every request routed to a draining name has reached its engine.

        A view resolves a name and starts its generation in one event-loop step (no await
        in between), so once a no-op has run on each serving loop, every request that
        resolved the name before it stopped routing is counted in `in_flight`.
        """
        try:
            current = asyncio.get_running_loop()  # never wait on our own loop
        except RuntimeError:
            current = None
        with self._lock:
            loops = [loop for loop in self._loops if loop.is_running() and loop is not current]
        for loop in loops:
            try:
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=10)
            except Exception:  # the loop stopped meanwhile: none of its requests can start
                continue

    def _drain_then_free(self, instance: _Instance) -> None:
        while instance.svc.in_flight:
            time.sleep(0.1)
        self._free(instance)

    def _free(self, instance: _Instance) -> None:
        name = instance.spec.name
        with self._lock:
            if self._instances.get(name) is instance:
                del self._instances[name]
                self._states.pop(name, None)
            # Tests may serve one service under two names; close it with its last name.
            shared = any(i.svc is instance.svc for i in self._instances.values())
        if not shared:
            for fn in list(self._unload_hooks):
                try:
                    fn(name, instance.svc)
                except Exception:
                    log.exception("an unload hook failed for model %s", name)
            instance.svc.close()
        log.info("unloaded %s", name)

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
            spec = LoadSpec.from_config(replace(config, name=name, path=str(svc.path)))
        else:  # routing tests register stand-ins
            spec = LoadSpec(name=name, path="")
        window = spec.ctx_cap or getattr(svc, "context_window_configured", 0)
        with self._lock:
            self._instances[name] = _Instance(
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


def resolve_chat_template(value: str) -> str:
    """The text of a `chat_template` load option: the option itself when it is a template
    ("{%" or "{{" in it), else the file it names inside the model folders. "" stays "".
    Raises PathNotAllowed, NotFound, or InvalidOption (unreadable, too big, or a template
    that does not compile)."""
    from engine import ChatTemplate, ChatTemplateError

    if not value:
        return ""
    if "{%" in value or "{{" in value:
        text = value
        if len(text.encode("utf-8", "replace")) > MAX_CHAT_TEMPLATE_BYTES:
            raise InvalidOption(f"chat_template: over {MAX_CHAT_TEMPLATE_BYTES} bytes")
    else:
        try:
            path = allowed_model_path(value)
        except PermissionError as exc:
            raise PathNotAllowed(f"chat_template: {exc}") from None
        if not is_file(path):
            raise NotFound(f"chat_template: no such file: {value}")
        if path.stat().st_size > MAX_CHAT_TEMPLATE_BYTES:
            raise InvalidOption(
                f"chat_template: {value} is over {MAX_CHAT_TEMPLATE_BYTES} bytes; "
                "a chat template is a small text file"
            )
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidOption(f"chat_template: {value} is not UTF-8 text") from None
        except OSError as exc:
            raise InvalidOption(f"chat_template: cannot read {value}: {exc}") from None
    try:
        ChatTemplate(text)
    except ChatTemplateError as exc:
        raise InvalidOption(f"chat_template: {exc}") from None
    return text


def _describe(exc: Exception) -> str:
    """An operator-facing reason: refusals speak for themselves, anything else names its type."""
    return str(exc) if isinstance(exc, OperatorError) else f"{type(exc).__name__}: {exc}"


def _placement(spec: LoadSpec) -> list:
    """The dies `spec` places its layers on, or [] for host memory."""
    try:
        return kernels.devices.dies.placement(spec.dies, spec.engine_config().backend)
    except ValueError:
        return []  # refused by checked_spec or, clearly, by the load itself


def _file_info(path: str) -> ModelFileInfo:
    try:
        return model_file_info(path)
    except FileNotFoundError as exc:
        raise NotFound(str(exc)) from None
    except ValueError as exc:
        raise OperationFailed(str(exc)) from None


def _as_spec(config: ModelConfig | LoadSpec) -> LoadSpec:
    return config if isinstance(config, LoadSpec) else LoadSpec.from_config(config)


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


def _setting(name: str, default):
    from django.conf import settings

    return getattr(settings, name, default)


def _test_load_delay(name: str) -> None:
    """Test hook (PANTHEON_TEST_LOAD_DELAY_MS, default 0: no effect): hold a load between
    its weights being in memory and its record, so a test can kill the server mid-load."""
    delay_ms = _setting("PANTHEON_TEST_LOAD_DELAY_MS", 0)
    if delay_ms > 0:
        log.warning("test hook: holding the load of %s for %d ms", name, delay_ms)
        time.sleep(delay_ms / 1000)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# --- settings -----------------------------------------------------------------------


def configured_models() -> list[ModelConfig]:
    """settings.PANTHEON_MODELS as engine configs."""
    from django.conf import settings

    return [ModelConfig(**spec) for spec in settings.PANTHEON_MODELS]


def configured_specs() -> list[LoadSpec]:
    """settings.PANTHEON_MODELS as load specs: what seeds an empty model store."""
    return [LoadSpec.from_config(cfg) for cfg in configured_models()]


def default_options() -> dict[str, int]:
    """The per-model options a load gets when the request leaves them at 0 / out."""
    defaults = dict(
        _setting(
            "PANTHEON_MODEL_DEFAULTS",
            {"ctx_cap": 0, "max_sessions": 4, "max_concurrent": 0, "reasoning_budget": 0},
        )
    )
    defaults["reasoning_budget"] = live_settings.value("reasoning_budget")
    return defaults


def _queue_limits() -> dict:
    """The queue's depth and timeout now (the runtime config, else the environment)."""
    return {
        "queue_depth": live_settings.value("queue_depth"),
        "queue_timeout_s": live_settings.value("queue_timeout_s"),
    }


def _push_queue_limits(changed: set[str]) -> None:
    """A changed queue depth or timeout reaches every loaded model at once: the next
    request is admitted (or refused) by it."""
    if not changed & {"queue_depth", "queue_timeout_s"}:
        return
    limits = _queue_limits()
    for info in get_runtime().instances():
        set_limits = getattr(info.svc, "set_queue_limits", None)  # tests' stand-ins lack it
        if set_limits is not None:
            set_limits(limits["queue_depth"], limits["queue_timeout_s"])


live_settings.on_change(_push_queue_limits)


@functools.cache
def build_id() -> str:
    """Short commit of the checkout this server runs from, "-dirty" when tracked files
    changed, or "unknown" (no git, not a checkout, no commit yet). Computed once."""
    from django.conf import settings

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(Path(settings.BASE_DIR)), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


_runtime = Runtime()  # the process's registry; tests swap it (tests/conftest.py use_runtime)


def get_runtime() -> Runtime:
    """The process's model registry: the one way any module reaches it. Looked up per
    call (never bound at import), so a registry a test puts in place is the one every
    view, consumer and background task sees."""
    return _runtime
