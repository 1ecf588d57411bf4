"""The runtime's questions to the kernels, in one place: whether a load's `dies`,
`quantize` and `kv_dtype` suit this host, where its layers go, what its weights compute
with and what a position of its KV cache costs; and the
device facts the views and the console report (GET /, /v1/models, /admin/dies, the
`pantheon --backend` command), so that none of them imports kernels."""

from __future__ import annotations

from dataclasses import dataclass

import kernels
import kernels.devices.dies
from kernels import kv_types
from kernels.devices.graphs import SUMMARY_KEYS
from pantheon_platform.runtime.django_settings import setting
from pantheon_platform.runtime.errors import InvalidOption
from pantheon_platform.runtime.load_spec import LoadSpec

MAX_DIES = 8  # the contract's PN_MODEL_MAX_DIES
# The CUDA-graph counters /v1/models shows of a model's `graphs` (GET /admin/models: all).
GRAPH_SUMMARY_KEYS = SUMMARY_KEYS
# The KV cache's types (the `kv_dtype` load option): f32 (exact, the default), f16, q8_0.
KV_DTYPES = kv_types.KV_DTYPES


@dataclass(frozen=True)
class DeviceFacts:
    """What this process computes on (GET /)."""

    backend: str  # "cuda" where CUDA dies were probed, else "cpu"
    kernel: str  # the compiled CPU kernels ("cpu"), or "numpy" when they were not built
    kernel_isa: str | None  # the compiled kernels' SIMD level; None on numpy
    kernel_activations: str | None  # what the decode products round activations to
    dies_visible: int


def backend_name() -> str:
    """The backend token: cuda or cpu."""
    return kernels.backend_name()


def device_facts() -> DeviceFacts:
    """The device facts for the configured backend (PANTHEON_BACKEND)."""
    configured = setting("PANTHEON_ENGINE_OPTIONS", {}).get("backend", "auto")
    return DeviceFacts(
        backend=kernels.backend_name(),
        kernel=kernels.kernel_name(configured),
        kernel_isa=kernels.kernel_isa(configured),
        kernel_activations=kernels.kernel_activations(configured),
        dies_visible=kernels.dies_visible(),
    )


def dies_listing() -> dict:
    """Every die the process sees, its budget (total minus PN_DIE_RESERVE_BYTES), what our
    allocations hold there and the models they are for (GET /admin/dies)."""
    return kernels.devices.dies.manager().listing()


def check_devices(spec: LoadSpec) -> None:
    """InvalidOption when `dies`, `quantize` or `kv_dtype` cannot be honoured on this
    host."""
    config = spec.config
    if config.kv_dtype not in KV_DTYPES:
        raise InvalidOption(f"kv_dtype: expected one of {', '.join(KV_DTYPES)}")
    if config.kv_dtype != kv_types.DEFAULT_KV_DTYPE and placement(spec):
        raise InvalidOption(
            f"kv_dtype {config.kv_dtype}: a model on dies keeps its KV cache as f32 (the "
            "cuda backend's attention reads float32 rows only); omit `kv_dtype` or `dies`"
        )
    if len(config.dies) > MAX_DIES:
        raise InvalidOption(f"at most {MAX_DIES} dies per model; got {len(config.dies)}")
    if config.dies:
        if kernels.dies_visible() == 0:
            raise InvalidOption(
                f"dies {list(config.dies)} named, but this server has no accelerator dies "
                f"(backend {kernels.backend_name()}); omit `dies`"
            )
        try:
            kernels.devices.dies.manager().get(config.dies)
        except ValueError as exc:
            raise InvalidOption(f"dies: {exc}") from None
        if config.quantize:
            raise InvalidOption(
                "quantize is for the compiled CPU kernels; a model on dies computes on "
                "its file's blocks as they are: omit `quantize` or `dies`"
            )
    elif config.quantize and kernels.kernel_name(spec.engine_config().backend) != "cpu":
        raise InvalidOption(
            "quantize needs the compiled CPU kernels, and this server runs the float32 "
            "numpy engine (PANTHEON_BACKEND, or the kernels were not built); omit "
            "`quantize` or send false"
        )


def placement(spec: LoadSpec) -> list:
    """The dies `spec` places its layers on, or [] for host memory."""
    try:
        return kernels.devices.dies.placement(spec.config.dies, spec.engine_config().backend)
    except ValueError:
        return []  # refused by check_devices or, clearly, by the load itself


def check_kv_dtype(kv_dtype: str, head_dim: int) -> None:
    """InvalidOption when a model's heads of `head_dim` cannot be stored as `kv_dtype`."""
    problem = kv_types.fits(kv_dtype, head_dim)
    if problem:
        raise InvalidOption(f"{problem}; use f16 or f32")


def kv_row_bytes(kv_dtype: str, head_dim: int) -> int:
    """Bytes of one position of one KV head stored as `kv_dtype` (the memory estimate)."""
    return kv_types.row_bytes(kv_dtype, head_dim)


def weights_kernel(spec: LoadSpec) -> str:
    """What the weights of `spec` compute with in host memory: "cpu" or "numpy" (also when
    the backend is refused: the load itself then says why)."""
    return kernels.kernel_name(spec.engine_config().backend)
