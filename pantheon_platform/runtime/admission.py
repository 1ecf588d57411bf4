"""What a load must pass before any weights are read: a valid spec (name, dies, pooling, a
path and a draft model inside the model folders, a chat template that compiles), room under
PANTHEON_MAX_LOADED_MODELS (least recently used idle models make way), and memory for
its estimate, in host memory or on each die it is split across."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import psutil

from engine import POOLINGS
from pantheon_platform.model_files import (
    ModelFileInfo,
    allowed_model_path,
    is_file,
    model_file_info,
)
from pantheon_platform.runtime import devices
from pantheon_platform.runtime.django_settings import setting
from pantheon_platform.runtime.errors import (
    Conflict,
    InsufficientMemory,
    InvalidOption,
    NotFound,
    OperationFailed,
    PathNotAllowed,
)
from pantheon_platform.runtime.load_spec import LoadSpec, resolve_chat_template
from pantheon_platform.runtime.records import Instance

if TYPE_CHECKING:
    from engine import ModelService


def checked_spec(spec: LoadSpec) -> LoadSpec:
    """`spec` with its path resolved inside the model folders, or an OperatorError."""
    if not spec.name.strip():
        raise InvalidOption("the model name must not be blank")
    devices.check_devices(spec)
    pooling = spec.config.pooling
    if pooling and pooling not in POOLINGS:
        raise InvalidOption(f"pooling: expected one of {', '.join(POOLINGS)}")
    try:
        path = str(allowed_model_path(spec.config.path))
    except PermissionError as exc:
        raise PathNotAllowed(str(exc)) from None
    resolve_chat_template(spec.config.chat_template)  # refuse a bad one before loading
    draft = spec.config.draft_model and _draft_path(spec.config.draft_model)
    return replace(spec, config=replace(spec.config, path=path, draft_model=draft))


def _draft_path(value: str) -> str:
    """The `draft_model` option's file inside the model folders (its vocabulary is checked
    by the engine's load: IncompatibleDraftModel)."""
    try:
        path = allowed_model_path(value)
    except PermissionError as exc:
        raise PathNotAllowed(f"draft_model: {exc}") from None
    if not is_file(path):
        raise NotFound(f"draft_model: no such file: {value}")
    return str(path)


def file_info(path: str) -> ModelFileInfo:
    try:
        return model_file_info(path)
    except FileNotFoundError as exc:
        raise NotFound(str(exc)) from None
    except ValueError as exc:
        raise OperationFailed(str(exc)) from None


def lru_victims(live: list[Instance], limit: int) -> list[str]:
    """Least-recently-used unpinned idle models among `live` to unload so one more fits
    under `limit` (PANTHEON_MAX_LOADED_MODELS); Conflict when only pinned or busy ones
    remain."""
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


def admit(spec: LoadSpec, info: ModelFileInfo, leaving: list[ModelService]) -> None:
    """InsufficientMemory unless the estimate for `spec` fits, counting the memory the
    `leaving` services (the models evicted for it) free."""
    devices.check_kv_dtype(spec.config.kv_dtype, info.head_dim)
    placed = devices.placement(spec)
    if placed:
        _admit_on_dies(spec, info, placed, leaving)
        return
    config = spec.config
    kernel = devices.weights_kernel(spec)
    row = devices.kv_row_bytes(config.kv_dtype, info.head_dim)
    need = info.estimate_bytes(config.ctx_cap, config.max_sessions, kernel, row)
    if config.draft_model:  # loaded beside it, with a KV slot per served slot
        need += file_info(config.draft_model).estimate_bytes(
            config.ctx_cap, config.max_sessions, kernel
        )
    freed = sum(svc.memory_bytes for svc in leaving)
    reserve = setting("PANTHEON_MEMORY_RESERVE_BYTES", 0)
    free = psutil.virtual_memory().available + freed - reserve
    if need > free:
        raise InsufficientMemory(
            f"not enough memory to load {spec.name!r}: it needs about {need} bytes "
            f"({_gib(need)}: {kernel} weights plus {config.kv_dtype} KV for "
            f"{config.max_sessions} sessions of "
            f"{info.context(config.ctx_cap)} tokens) but {max(free, 0)} bytes "
            f"({_gib(max(free, 0))}) are free after the {reserve}-byte reserve; "
            f"lower ctx_cap or max_sessions, or unload a model"
        )


def _admit_on_dies(spec: LoadSpec, info: ModelFileInfo, dies: list, leaving) -> None:
    """Admission on dies: each die takes its share of the layers (weights as the file's
    blocks plus their KV) and must have it free in its budget (total minus
    PN_DIE_RESERVE_BYTES) beside what our allocations already hold there."""
    config = spec.config
    slots = config.max_concurrent or config.max_sessions
    row = devices.kv_row_bytes(config.kv_dtype, info.head_dim)
    need = info.estimate_bytes(config.ctx_cap, slots, "cpu", row)
    share = -(-need // len(dies))
    for die in dies:
        freed = sum(svc.memory_bytes // len(svc.dies) for svc in leaving if die.ordinal in svc.dies)
        free = die.free + freed
        if share > free:
            raise InsufficientMemory(
                f"not enough memory on die {die.ordinal} to load {spec.name!r}: its share "
                f"of the layers needs about {share} bytes ({_gib(share)}: the file's blocks "
                f"plus {config.kv_dtype} KV for {slots} slots of "
                f"{info.context(config.ctx_cap)} tokens, split across {len(dies)} dies) but "
                f"{max(free, 0)} bytes ({_gib(max(free, 0))}) of the die's "
                f"{die.budget}-byte budget are free; lower ctx_cap or max_sessions, name "
                f"more dies, or unload a model"
            )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
