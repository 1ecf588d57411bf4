"""Loading and unloading: the start-up loader, operator loads (admitted, evicting the
least recently used idle model if needed, one at a time) and unloads that drain in-flight
generations before freeing a model. `Runtime` is the registry with these operations."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from engine import LoadProgress, ModelConfig
from pantheon_platform import live_settings
from pantheon_platform.runtime import admission
from pantheon_platform.runtime.django_settings import hold_load_for_test
from pantheon_platform.runtime.errors import (
    Conflict,
    InvalidOption,
    NotFound,
    OperationFailed,
    describe,
)
from pantheon_platform.runtime.load_spec import LoadSpec, configured_specs
from pantheon_platform.runtime.records import (
    FAILED,
    LOADED,
    LOADING,
    UNLOADING,
    Instance,
    InstanceInfo,
    LoadingInfo,
    ModelState,
    UnloadResult,
)
from pantheon_platform.runtime.registry import Registry
from pantheon_platform.runtime.store import Store

if TYPE_CHECKING:
    from engine import ModelService

log = logging.getLogger("pantheon.runtime")


class Runtime(Registry):
    def __init__(self, store: Store | None = None) -> None:
        super().__init__(store)
        # One load at a time: two dequantisations at once could together exhaust memory
        # that each alone was admitted to.
        self._load_lock = threading.Lock()
        self._loader: threading.Thread | None = None

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
                self._states[spec.name] = ModelState(FAILED, describe(exc))

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
            spec = admission.checked_spec(spec)  # start-up specs come unchecked from the store
            with self._lock:
                self._loading[spec.name] = spec  # the loading row shows the file it reads
            with self._load_lock:
                info = admission.file_info(spec.config.path)
                victims = self._victims_for_one_more()
                with self._lock:
                    leaving = [self._instances[v].svc for v in victims]
                admission.admit(spec, info, leaving)
                for victim in victims:
                    log.info("evicting %s (least recently used) to load %s", victim, spec.name)
                    self.unload(victim, reason="evicted")
                svc = self._open(spec)
                hold_load_for_test(spec.name)
                try:
                    self._persist("the load of", spec.name, self._store.loaded, spec)
                except OperationFailed:
                    svc.close()
                    raise
                self._run_load_hooks(spec.name, svc)
                # What the operator asked for (the contract's *_configured), else the default.
                window = spec.config.ctx_cap or info.context(0)
                with self._lock:
                    self._instances[spec.name] = Instance(
                        spec, svc, spec.pinned, time.time(), next(self._ticks), window
                    )
                    self._states[spec.name] = ModelState(LOADED)
                return self._info(spec.name)
        except Exception as exc:
            log.error("model %s failed to load: %s", spec.name, describe(exc))
            try:
                self._store.failed(spec, describe(exc))
            except Exception:
                log.exception("cannot record the failed load of %s", spec.name)
            raise
        finally:
            with self._lock:
                self._loading.pop(spec.name, None)
                self._progress.pop(spec.name, None)

    def _victims_for_one_more(self) -> list[str]:
        limit = live_settings.value("max_loaded_models")
        with self._lock:
            live = [i for i in self._instances.values() if not i.draining]
        return admission.lru_victims(live, limit)

    def _run_load_hooks(self, name: str, svc: ModelService) -> None:
        for fn in list(self._load_hooks):
            try:
                fn(name, svc)
            except Exception:
                log.exception("a load hook failed for model %s (the model is loaded)", name)

    def _open(self, spec: LoadSpec) -> ModelService:
        from engine import (
            IncompatibleDraftModel,
            ModelFileNotFound,
            ModelLoadError,
            ModelService,
            UnsupportedArchitecture,
        )

        log.info("loading model %s from %s", spec.name, spec.config.path)
        started = time.monotonic()
        config = spec.engine_config()  # a refusal here (chat_template) is the operator's
        try:
            svc = ModelService.load(config, lambda p: self._note_progress(spec.name, p))
        except ModelFileNotFound as exc:
            raise NotFound(str(exc)) from exc
        except (UnsupportedArchitecture, IncompatibleDraftModel) as exc:
            raise InvalidOption(str(exc)) from exc  # the file, not the server: 400 naming it
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

    def _drain(self, instance: Instance, timeout: float) -> bool:
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

    def _drain_then_free(self, instance: Instance) -> None:
        while instance.svc.in_flight:
            time.sleep(0.1)
        self._free(instance)

    def _free(self, instance: Instance) -> None:
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


def _as_spec(config: ModelConfig | LoadSpec) -> LoadSpec:
    return config if isinstance(config, LoadSpec) else LoadSpec(config)
