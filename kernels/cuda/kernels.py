"""The GPU backend's CUDA C kernels (kernels/cuda/*.cu) and their Python launchers (issue 16).

The sources are compiled at run time by CuPy (`cupy.RawModule`, NVRTC), once per device,
on first use. Each .cu's `#include "blocks.cuh"` is inlined here, so NVRTC needs no include
path. Options: `--fmad=false` keeps every multiply and add a separate IEEE float32
operation, so the decoders are bitwise gguf-py's and the mat-vec, RMSNorm and RoPE bitwise
their numpy twins (kernels/cuda/twins.py); a decode mat-vec is bound by memory, not by
FMAs. CuPy is imported inside the functions: this module imports without it.

Launchers take CuPy arrays (float32 activations, uint8 blocks as the file's bytes) on the
current device; the caller enters the device (`cupy.cuda.Device`) and its stream.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

CUDA_DIR = Path(__file__).resolve().parent  # the .cu sources sit beside this module
OPTIONS = ("--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")

# GGUF type -> the suffix of its matvec_ / dequantize_ kernels (blocks.cuh's type list).
QTYPES: dict[Q, str] = {
    Q.Q4_0: "q4_0",
    Q.Q4_1: "q4_1",
    Q.Q5_0: "q5_0",
    Q.Q5_1: "q5_1",
    Q.Q8_0: "q8_0",
    Q.Q4_K: "q4_k",
    Q.Q5_K: "q5_k",
    Q.Q6_K: "q6_k",
    Q.F32: "f32",
    Q.F16: "f16",
    Q.BF16: "bf16",
}
K_QUANTS = {Q.Q4_K, Q.Q5_K, Q.Q6_K}
ACTIVATIONS = {"silu": "glu_silu", "gelu_tanh": "glu_gelu_tanh"}

# Each program and the kernels the launchers below use from it (tests/kernels/
# test_cuda_sources.py checks them against the compiled entry points).
PROGRAMS: dict[str, tuple[str, ...]] = {
    "quant.cu": tuple(f"{op}_{s}" for s in QTYPES.values() for op in ("matvec", "dequantize")),
    "ops.cu": ("rms_norm", "rope", *ACTIVATIONS.values(), "softcap"),
    "attention.cu": ("kv_write", "attention_chunk", "attention_combine"),
}


def sources() -> dict[str, str]:
    """{file name: text} of every file in kernels/cuda."""
    return {
        p.name: p.read_text() for p in sorted(CUDA_DIR.iterdir()) if p.suffix in (".cu", ".cuh")
    }


def program(name: str) -> str:
    """The text NVRTC compiles for one .cu: its `#include "x.cuh"` lines replaced by x.cuh."""
    files = sources()
    return re.sub(r'^#include "([\w.]+)"$', lambda m: files[m[1]], files[name], flags=re.M)


@cache
def define(name: str) -> int:
    """An integer `#define` of the sources (tile sizes, chunk length): one value, here and there."""
    for text in sources().values():
        if m := re.search(rf"^#define {name} (\d+)\b", text, flags=re.M):
            return int(m[1])
    raise KeyError(name)


def values_per_block(qtype: Q) -> int:
    """The kernels' block: 256 values for the K-quants, 32 for the others (float types too)."""
    return 256 if qtype in K_QUANTS else 32


def supports(qtype: Q, k: int) -> bool:
    """Whether matvec / dequantize have a kernel for rows of k values of qtype."""
    return qtype in QTYPES and k % values_per_block(qtype) == 0


# ---- compiling ------------------------------------------------------------------------

_KERNEL_PROGRAM = {kernel: name for name, kernels in PROGRAMS.items() for kernel in kernels}
_modules: dict[tuple[int, str], object] = {}


def _kernel(name: str):
    """The compiled kernel `name` on the current device (NVRTC once per program and device)."""
    import cupy

    key = (cupy.cuda.Device().id, _KERNEL_PROGRAM[name])
    module = _modules.get(key)
    if module is None:
        module = _modules[key] = cupy.RawModule(code=program(key[1]), options=OPTIONS)
    return module.get_function(name)


def _elementwise(count: int) -> tuple[tuple[int], tuple[int]]:
    threads = define("ELEMENT_THREADS")
    return ((count + threads - 1) // threads,), (threads,)


def _device_ints(cupy, values) -> object:
    """Index values as the kernels' int32: host ones uploaded; device ones (a captured
    graph's input buffers) converted there, never read back."""
    if isinstance(values, cupy.ndarray):
        return values.astype(cupy.int32)
    return cupy.asarray(np.asarray(values, dtype=np.int32))


def _aligned(cupy, x):
    """x itself when it starts on 16 bytes (the mat-vec reads it as float4), else a copy:
    a contiguous slice may start anywhere (CuPy's own allocations are 256-byte aligned)."""
    address = getattr(x.data, "ptr", None)
    if address is None:  # the emulator's arrays (tests/kernels/cuda/cuda_emu)
        address = x.ctypes.data
    if address % 16 == 0:
        return x
    copy = cupy.empty_like(x)
    copy[...] = x
    return copy


def _ints(*values: int) -> tuple:
    """Kernel int arguments: CuPy passes a Python int as 64 bits, an `int` parameter wants 32."""
    return tuple(np.int32(v) for v in values)


# ---- launchers ------------------------------------------------------------------------


def matvec(x, blocks, qtype: Q, n: int, k: int, out=None):
    """x (B, K) float32 @ W.T -> (B, n); W: n rows of `blocks` (n, bytes per row), the
    file's bytes (F32 may be the float32 matrix itself). `out` may be a column slice of a
    wider row-major array (a part of stacked matrices)."""
    import cupy

    x = _aligned(cupy, cupy.ascontiguousarray(x, dtype=np.float32))
    blocks = cupy.ascontiguousarray(blocks)
    B = x.shape[0]
    if out is None:
        out = cupy.empty((B, n), dtype=np.float32)
    if x.shape[1] != k or out.shape != (B, n) or out.strides[1] != 4:
        raise ValueError(f"matvec of x {x.shape} by ({n}, {k}) into {out.shape} {out.strides}")
    rows, tile = define("MATVEC_ROWS"), define("MATVEC_TILE")
    grid = ((n + rows - 1) // rows, (B + tile - 1) // tile)
    if B and n:
        args = (blocks, x, out, *_ints(n, k, B, out.strides[0] // 4))
        _kernel(f"matvec_{QTYPES[qtype]}")(grid, (32 * rows,), args)
    return out


def dequantize(blocks, qtype: Q, n: int, k: int):
    """blocks (n, bytes per row) -> (n, k) float32: xp_quants.dequantize's values."""
    import cupy

    blocks = cupy.ascontiguousarray(blocks)
    out = cupy.empty((n, k), dtype=np.float32)
    if out.size:
        grid, block = _elementwise(n * k // 8)
        _kernel(f"dequantize_{QTYPES[qtype]}")(grid, block, (blocks, out, *_ints(n, k)))
    return out


def rms_norm(x, weight, eps: float):
    """x * rsqrt(mean(x^2) + eps) * weight over the last axis, any leading shape."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=np.float32)
    D = x.shape[-1]
    out = cupy.empty_like(x)
    rows = x.size // D
    if rows:
        args = (x, weight, out, np.int32(D), np.float32(eps))
        _kernel("rms_norm")((rows,), (define("NORM_THREADS"),), args)
    return out


def rope(x, positions, cos, sin, neox: bool):
    """Rotate x (n, H, Dh) at positions (n,), cos / sin (n_pos, Dh / 2): the two halves when
    neox, else adjacent pairs."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=np.float32)
    n, H, Dh = x.shape
    if cos.shape[1] * 2 != Dh:
        raise ValueError(f"RoPE table of {cos.shape[1]} frequencies for head_dim {Dh}")
    out = cupy.empty_like(x)
    pairs = n * H * (Dh // 2)
    if pairs:
        pos = _device_ints(cupy, positions)
        args = (x, out, pos, cos, sin, *_ints(H, Dh, neox), np.int64(pairs))
        _kernel("rope")(*_elementwise(pairs), args)
    return out


def glu(gate_up, d_ff: int, activation: str):
    """act(gate) * up over gate_up (n, 2F) -> (n, F); activation "silu" or "gelu_tanh"."""
    import cupy

    gate_up = cupy.ascontiguousarray(gate_up, dtype=np.float32)
    out = cupy.empty((gate_up.shape[0], d_ff), dtype=np.float32)
    if out.size:
        args = (gate_up, out, np.int32(d_ff), np.int64(out.size))
        _kernel(ACTIVATIONS[activation])(*_elementwise(out.size), args)
    return out


def softcap(x, cap: float):
    """cap * tanh(x / cap)."""
    import cupy

    x = cupy.ascontiguousarray(x, dtype=np.float32)
    out = cupy.empty_like(x)
    if out.size:
        args = (x, out, np.float32(cap), np.int64(out.size))
        _kernel("softcap")(*_elementwise(out.size), args)
    return out


def attention_decode(
    q, k, v, cache_k, cache_v, layer, slots, positions, scale, window=0, softcap=0.0
):
    """Row b writes k[b], v[b] (Hkv, Dh) at positions[b] of slots[b] in the caches
    (n_layer, n_slots, Hkv, n_ctx, Dh), then attends q[b] (H, Dh) over that slot's
    visible positions (kernels/cuda/attention.cu). slots, positions: host integers, or
    device arrays (a captured decode step: nothing is read back). Returns (B, H * Dh)."""
    import cupy

    q = cupy.ascontiguousarray(q, dtype=np.float32)
    k = cupy.ascontiguousarray(k, dtype=np.float32)
    v = cupy.ascontiguousarray(v, dtype=np.float32)
    B, H, Dh = q.shape
    _, n_slots, Hkv, n_ctx, _ = cache_k.shape
    if Dh > define("ATT_MAX_HEAD_DIM") or H % Hkv or cache_k.dtype != np.float32:
        raise ValueError(f"no attention kernel for {H} heads of {Dh} over {Hkv} KV heads")
    out = cupy.empty((B, H * Dh), dtype=np.float32)
    if not B:
        return out
    if isinstance(positions, cupy.ndarray):
        # A captured step's positions: unknown here, so chunks for the whole window (the
        # chunks past a row's position return at once; attention_combine never reads them).
        n_chunks = -(-n_ctx // define("ATT_CHUNK"))
    else:
        positions = np.asarray(positions, dtype=np.int64)
        n_chunks = int(positions.max()) // define("ATT_CHUNK") + 1
    pos = _device_ints(cupy, positions)
    cache = (
        cache_k,
        cache_v,
        _device_ints(cupy, slots),
        pos,
        *_ints(layer, n_slots, Hkv, n_ctx, Dh),
    )
    _kernel("kv_write")(*_elementwise(B * Hkv * Dh), (*cache, k, v, np.int32(B)))
    part_o = cupy.empty((B, H, n_chunks, Dh), dtype=np.float32)
    part_m = cupy.empty((B, H, n_chunks), dtype=np.float32)
    part_l = cupy.empty((B, H, n_chunks), dtype=np.float32)
    threads = (define("ATT_THREADS"),)
    row = (q, *_ints(H, n_chunks), np.float32(scale), np.int32(window), np.float32(softcap))
    _kernel("attention_chunk")((n_chunks, H, B), threads, (*cache, *row, part_o, part_m, part_l))
    combine = (part_o, part_m, part_l, pos, out, *_ints(H, Dh, n_chunks, window))
    _kernel("attention_combine")((H, B), threads, combine)
    return out
