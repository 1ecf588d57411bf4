"""What the registry records about each name (its state, the live instance) and the
snapshots it hands out to views (InstanceInfo, LoadingInfo, UnloadResult)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pantheon_platform.runtime.load_spec import LoadSpec

if TYPE_CHECKING:
    from engine import LoadProgress, ModelService

LOADING, LOADED, FAILED, UNLOADING = "loading", "loaded", "failed", "unloading"


@dataclass(frozen=True)
class ModelState:
    state: str  # LOADING | LOADED | FAILED | UNLOADING
    error: str = ""


@dataclass
class Instance:
    """A live model in the registry (mutable: pins, LRU ticks, draining)."""

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
