"""Accelerator dies: one engine thread per die, and what each die's memory holds.

A `Die` is one device a model's layers can live on: its array module (`xp`), its memory
budget (total minus PN_DIE_RESERVE_BYTES) and the bytes our allocations hold there, per
owner (a model's weights, an instance's KV cache). Work for a die runs on that die's one
engine thread (`Die.run`): on CUDA the thread makes its device current once and runs each
call on its own stream, synchronised before the result is handed back, so a model split
across dies [i, j] passes its hidden state from die i's thread to die j's
(engine.models._pipeline) and the HTTP side sees nothing of it.

`DieManager` holds the dies this process probed: CUDA devices through CuPy (ordinals are
CUDA_VISIBLE_DEVICES-relative, as `--dies` and the `dies` load option mean them), none
without CuPy or a card. `host_dies(n)` makes dies whose memory is host memory and whose
xp is numpy: the suite runs the die logic (pipelines, budgets, admission, /admin/dies)
on them; a server never probes them (`use_manager` installs them, tests only).

No Django here: kernels sits below the engine.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np

# At most this many dies per model (the contract's PN_MODEL_MAX_DIES).
MAX_DIES_PER_MODEL = 8
RESERVE_ENV = "PN_DIE_RESERVE_BYTES"
DEFAULT_RESERVE_BYTES = 512 << 20  # the CUDA context, cuBLAS workspaces, graph pools


def reserve_bytes() -> int:
    """PN_DIE_RESERVE_BYTES (bytes kept free on every die), else the default."""
    try:
        return max(int(os.environ.get(RESERVE_ENV, DEFAULT_RESERVE_BYTES)), 0)
    except ValueError:
        return DEFAULT_RESERVE_BYTES


class DieWorker:
    """One die's engine thread: runs submitted calls one at a time, in order, inside the
    die's context (device current, its stream)."""

    def __init__(self, name: str, context: Callable[[], contextlib.AbstractContextManager]):
        # context(): entered once by the thread; yields the function that waits for the
        # work the thread queued (a CUDA stream's synchronize; nothing on a host die).
        self._context = context
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn(*args, **kwargs) on this die's thread; its result, or its exception raised
        here. Called from the die's own thread (a stage calling back in), it runs at once."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: Future = Future()
        self._calls.put((future, fn, args, kwargs))
        return future.result()

    def _loop(self) -> None:
        with self._context() as sync:
            while True:
                item = self._calls.get()
                if item is None:
                    return
                future, fn, args, kwargs = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    result = fn(*args, **kwargs)
                    # The work queued on the die's stream is done before anyone else (the
                    # next stage on another die's stream, the host) reads what it wrote.
                    sync()
                    future.set_result(result)
                except BaseException as exc:  # handed to the caller, raised there
                    future.set_exception(exc)

    def stop(self) -> None:
        self._calls.put(None)
        self._thread.join(timeout=10)


class Die:
    """One device: its array module, memory budget and our allocations on it."""

    def __init__(
        self,
        ordinal: int,
        xp,
        total_bytes: int,
        reserve: int,
        kind: str,
        card: int | None = None,
    ):
        self.ordinal = ordinal
        self.card = ordinal if card is None else card
        self.xp = xp
        self.kind = kind  # "cuda" or "host"
        self.total_bytes = int(total_bytes)
        self.reserve = int(reserve)
        self._held: dict[str, tuple[str, int]] = {}  # owner -> (model name, bytes)
        self._lock = threading.Lock()
        self._worker: DieWorker | None = None

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.ordinal}"

    # ---- the engine thread ----

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn on this die's engine thread (started on first use)."""
        with self._lock:
            if self._worker is None:
                self._worker = DieWorker(f"die-{self.name}", self._context)
            worker = self._worker
        return worker.call(fn, *args, **kwargs)

    def _context(self) -> contextlib.AbstractContextManager:
        if self.kind != "cuda":
            return contextlib.nullcontext(lambda: None)
        return _cuda_context(self.xp, self.ordinal)

    def stop(self) -> None:
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    # ---- memory ----

    @property
    def budget(self) -> int:
        """What our allocations may use: the die's total minus the reserve."""
        return max(self.total_bytes - self.reserve, 0)

    @property
    def used(self) -> int:
        with self._lock:
            return sum(n for _, n in self._held.values())

    @property
    def free(self) -> int:
        return max(self.budget - self.used, 0)

    def hold(self, owner: str, model: str, nbytes: int) -> None:
        """Record `nbytes` allocated here for `model` under `owner` (replacing what that
        owner held)."""
        with self._lock:
            self._held[owner] = (model, int(nbytes))

    def drop(self, owner: str) -> None:
        with self._lock:
            self._held.pop(owner, None)

    def models(self) -> list[str]:
        """The models holding memory here, in the order they arrived."""
        with self._lock:
            return list(dict.fromkeys(model for model, _ in self._held.values()))

    def row(self) -> dict:
        """This die's /admin/dies row."""
        models = self.models()
        return {
            "die": self.ordinal,
            "card": self.card,
            "model": models[0] if models else "",
            "n_models": len(models),
            "vram_budget": self.budget,
            "vram_used": self.used,
        }


@contextlib.contextmanager
def _cuda_context(cupy, ordinal: int) -> Iterator[Callable[[], None]]:
    """The die's device current for the whole thread, and its own non-blocking stream."""
    with cupy.cuda.Device(ordinal):
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            yield stream.synchronize


_kv_serials = itertools.count()


class SplitKV:
    """The KV caches of a model split across dies (each holds its stage's layers, on its
    die) behind one KV cache interface; every call on a part runs on that part's die."""

    def __init__(self, parts: list[tuple[Die, Any]]):
        self.parts = parts  # (die, KV cache), in layer order
        self.serial = next(_kv_serials)  # never reused, unlike id(): keys its CUDA graphs
        self.n_ctx = parts[0][1].n_ctx
        self.n_slots = parts[0][1].n_slots

    def _each(self, method: str, *args) -> list:
        return [die.run(getattr(kv, method), *args) for die, kv in self.parts]

    def note_written(self, slots, ends) -> None:
        self._each("note_written", slots, ends)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self._each("copy_prefix", src, dst, n)

    def release(self, slot: int, keep: int = 0) -> int:
        return sum(self._each("release", slot, keep))

    def take(self, slot: int, n: int, keep: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """`save`: pages of device memory cannot move to the host (kv_cache.KVCache.take)."""
        return self.save(slot, n)

    def save(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(n_layer, Hkv, n, Dh) host copies of every part's layers, in layer order."""
        saved = self._each("save", slot, n)
        return np.concatenate([k for k, _ in saved]), np.concatenate([v for _, v in saved])

    def load(self, slot: int, k: np.ndarray, v: np.ndarray, n: int) -> None:
        start = 0
        for die, kv in self.parts:
            stop = start + kv.layout[0]
            die.run(kv.load, slot, k[start:stop], v[start:stop], n)
            start = stop

    @property
    def kv_dtype(self) -> str:
        return self.parts[0][1].kv_dtype

    @property
    def layout(self) -> tuple[int, int, int]:
        _, n_kv_head, head_dim = self.parts[0][1].layout
        return sum(kv.layout[0] for _, kv in self.parts), n_kv_head, head_dim

    def bytes_per_token(self) -> int:
        return sum(kv.bytes_per_token() for _, kv in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(kv.nbytes for _, kv in self.parts)


class DieManager:
    """The dies this process can place models on."""

    def __init__(self, dies: list[Die]):
        self.dies = list(dies)

    def __len__(self) -> int:
        return len(self.dies)

    @property
    def kind(self) -> str:
        """The dies' kind: cuda, host (the suite's), or none."""
        return self.dies[0].kind if self.dies else "none"

    def get(self, ordinals) -> list[Die]:
        """The dies named by `ordinals`; ValueError saying which one is not there."""
        ordinals = [int(i) for i in ordinals]
        if len(set(ordinals)) != len(ordinals):
            raise ValueError(f"dies {ordinals} name a die twice")
        missing = [i for i in ordinals if not 0 <= i < len(self.dies)]
        if missing:
            raise ValueError(
                f"die {missing[0]} is not visible: this server sees {len(self.dies)} "
                f"({', '.join(d.name for d in self.dies) or 'none'})"
            )
        return [self.dies[i] for i in ordinals]

    def listing(self) -> dict:
        """GET /admin/dies."""
        return {"object": "list", "n_dies": len(self.dies), "data": [d.row() for d in self.dies]}

    def stop(self) -> None:
        for die in self.dies:
            die.stop()


def placement(ordinals, backend: str) -> list[Die]:
    """The dies a model's layers go on: `ordinals` in order; none named means die 0 for the
    "cuda" backend and no die (host memory) for any other. ValueError for a die this
    process does not see."""
    ordinals = tuple(ordinals) or ((0,) if backend == "cuda" else ())
    return manager().get(ordinals) if ordinals else []


def probe_cuda(reserve: int | None = None) -> list[Die]:
    """Every CUDA device CuPy can use, as a die (none without CuPy, a driver or a card)."""
    reserve = reserve_bytes() if reserve is None else reserve
    try:
        import cupy  # the optional `cuda` extra

        count = int(cupy.cuda.runtime.getDeviceCount())
        dies = []
        for i in range(count):
            with cupy.cuda.Device(i):
                _, total = cupy.cuda.runtime.memGetInfo()
            dies.append(Die(i, cupy, total, reserve, "cuda"))
        return dies
    except Exception:
        return []


def host_dies(n: int, total_bytes: int = 1 << 34, reserve: int = 0) -> list[Die]:
    """n dies of host memory computed on by numpy: the die logic without a GPU."""
    return [Die(i, np, total_bytes, reserve, "host") for i in range(n)]


_installed: list[DieManager] = []


@functools.cache
def _probed() -> DieManager:
    return DieManager(probe_cuda())


def manager() -> DieManager:
    """The process's dies: the CUDA devices probed once, or what `use_manager` installed."""
    return _installed[-1] if _installed else _probed()


@contextlib.contextmanager
def use_manager(dies: DieManager) -> Iterator[DieManager]:
    """Place models on `dies` instead of the probed ones (tests: host dies)."""
    _installed.append(dies)
    try:
        yield dies
    finally:
        _installed.remove(dies)
        dies.stop()
