"""The one Django-side module that builds and holds engine objects.

A process-wide `runtime` loads the configured models in a background thread (one after
the other, so two loads never compete for memory), remembers each name's state
(loading / loaded / failed) for GET /, and routes a request's `model` to a service.
Views ask the runtime; they never construct engine objects themselves.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import kernels
from inference.engine.types import ModelConfig

if TYPE_CHECKING:
    from inference.engine.service import ModelService

log = logging.getLogger("pantheon.runtime")

LOADING, LOADED, FAILED = "loading", "loaded", "failed"


class NoModelsLoaded(Exception):
    """Nothing can serve a completion yet (still loading, load failed, or none configured)."""


class ModelNotFound(Exception):
    """Several models are loaded and the request's `model` names none of them."""


@dataclass(frozen=True)
class ModelState:
    state: str  # LOADING | LOADED | FAILED
    error: str = ""


class Runtime:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._services: dict[str, ModelService] = {}
        self._states: dict[str, ModelState] = {}
        self._loader: threading.Thread | None = None

    # --- loading ----------------------------------------------------------------------

    def start_loading(self, configs: Iterable[ModelConfig] | None = None) -> None:
        """Load `configs` (default: settings.PANTHEON_MODELS) in a background thread.

        Idempotent: only the first call starts a loader. Returns at once; GET / reports
        progress while the weights load.
        """
        with self._lock:
            if self._loader is not None:
                return
            if configs is None:
                configs = configured_models()
            configs = list(configs)
            for cfg in configs:
                self._states[cfg.name] = ModelState(LOADING)
            # Daemon: a Ctrl-C during a long load must not wait for it.
            self._loader = threading.Thread(
                target=self._load_all, args=(configs,), name="pantheon-loader", daemon=True
            )
            self._loader.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Block until the loader thread is done (for scripts and tests)."""
        loader = self._loader
        if loader is None:
            return True
        loader.join(timeout)
        return not loader.is_alive()

    def _load_all(self, configs: list[ModelConfig]) -> None:
        for cfg in configs:
            self._load_one(cfg)

    def _load_one(self, cfg: ModelConfig) -> None:
        log.info("loading model %s from %s", cfg.name, cfg.path)
        started = time.monotonic()
        try:
            from inference.engine.service import ModelService

            svc = ModelService.load(cfg)
        except Exception as exc:  # one bad model must not stop the others or the server
            log.exception("model %s failed to load", cfg.name)
            with self._lock:
                self._states[cfg.name] = ModelState(FAILED, f"{type(exc).__name__}: {exc}")
            return
        log.info(
            "loaded model %s in %.1f s (%s, context window %d, backend %s)",
            cfg.name,
            time.monotonic() - started,
            svc.architecture,
            svc.context_window,
            kernels.backend_name(),
        )
        self.register(cfg.name, svc)

    # --- registry ---------------------------------------------------------------------

    def register(self, name: str, svc: ModelService) -> None:
        """Serve an already-loaded service under `name` (the loader, and tests that load
        the model once per session). The same service may be registered under two names."""
        with self._lock:
            self._services[name] = svc
            self._states[name] = ModelState(LOADED)

    def unregister(self, name: str) -> ModelService | None:
        """Stop serving `name`; the caller owns (and closes) the returned service."""
        with self._lock:
            self._states.pop(name, None)
            return self._services.pop(name, None)

    def services(self) -> dict[str, ModelService]:
        with self._lock:
            return dict(self._services)

    def states(self) -> dict[str, ModelState]:
        with self._lock:
            return dict(self._states)

    def resolve(self, model: str | None) -> tuple[str, ModelService]:
        """The (served name, service) a request's `model` routes to.

        One loaded model: any value, or none, routes to it. Several: the exact name.
        """
        with self._lock:
            services = dict(self._services)
            states = dict(self._states)
        if not services:
            raise NoModelsLoaded(_why_none_loaded(states))
        if model and model in services:
            return model, services[model]
        if len(services) == 1:
            return next(iter(services.items()))
        served = ", ".join(sorted(services))
        if not model:
            raise ModelNotFound(f"several models are loaded ({served}); name one in `model`")
        raise ModelNotFound(f"model {model!r} is not loaded; loaded models: {served}")

    def close(self) -> None:
        """Close every service (once each, even if registered under several names)."""
        with self._lock:
            services = list({id(s): s for s in self._services.values()}.values())
            self._services.clear()
            self._states.clear()
        for svc in services:
            svc.close()


def _why_none_loaded(states: dict[str, ModelState]) -> str:
    loading = sorted(name for name, s in states.items() if s.state == LOADING)
    failed = {name: s.error for name, s in states.items() if s.state == FAILED}
    if loading:
        return f"no models loaded yet: still loading {', '.join(loading)}; retry shortly"
    if failed:
        why = "; ".join(f"{name} failed to load ({error})" for name, error in failed.items())
        return f"no models loaded: {why}"
    return "no models loaded: none is configured (set PANTHEON_MODELS)"


def configured_models() -> list[ModelConfig]:
    """settings.PANTHEON_MODELS as engine configs."""
    from django.conf import settings

    return [ModelConfig(**spec) for spec in settings.PANTHEON_MODELS]


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


runtime = Runtime()
