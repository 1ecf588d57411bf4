"""numpy twins of the CUDA kernels (kernels/cuda/*.cu, issue 16): what each kernel computes,
in the kernel's order where that decides the bits.

The kernels cannot run without a GPU; their twins run everywhere. tests/kernels/
test_cuda_twins.py checks the twins against the numpy reference (kernels/reference/backend,
kernels/xp/quants) and for batch invariance; tests/gpu/test_cuda_kernels.py checks each
kernel against its twin on a device. The sources are compiled with --fmad=false, so where a
twin repeats the kernel's float32 operations in the kernel's order (dequantize, matvec,
rms_norm, rope) the device must give the same bits; where the kernel calls expf / tanhf
(glu, softcap, attention) CUDA's functions differ from numpy's by a few ulp and the twin
mirrors the structure (chunks, maxima, the combine), not the bits.
"""

from __future__ import annotations

import numpy as np

from kernels.cuda.kernels import define
from kernels.xp import quants as xp_quants

F32 = np.float32


def dequantize(blocks: np.ndarray, qtype) -> np.ndarray:
    """Twin of quant.cu dequantize_<type>: blocks.cuh decodes every type operation for
    operation as xp_quants does, so the values are xp_quants' (and gguf-py's)."""
    return xp_quants.dequantize(np, blocks, qtype)


def matvec(x: np.ndarray, blocks: np.ndarray, qtype) -> np.ndarray:
    """Twin of quant.cu matvec_<type>: x (B, K) @ W.T. Lane l of a row's warp accumulates
    values 256 i + 8 l + j (i, then j = 0..7) times x, one accumulator per x-row; then the
    xor-shuffle tree over the 32 lanes (lane 0's sum). Columns past K (a row of 32-value
    blocks that is not a whole 256) add 0 * 0, which leaves an accumulator as the idle
    lane leaves it: sums that start at +0 are never -0."""
    w = dequantize(blocks, qtype)
    (B, K), N = x.shape, w.shape[0]
    pad = ((0, 0), (0, -K % 256))
    w = np.pad(w, pad).reshape(N, -1, 32, 8)
    xs = np.pad(x.astype(F32, copy=False), pad).reshape(B, -1, 32, 8)
    acc = np.zeros((B, N, 32), dtype=F32)
    for i in range(w.shape[1]):
        for j in range(8):
            acc += w[None, :, i, :, j] * xs[:, None, i, :, j]
    return _xor_tree(acc)[..., 0]


def _xor_tree(lanes: np.ndarray) -> np.ndarray:
    """__shfl_xor_sync sums over the last axis (32 lanes): lane l adds lane l ^ 16, ^ 8, ..."""
    lane = np.arange(32)
    for off in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[..., lane ^ off]
    return lanes


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Twin of ops.cu rms_norm: thread t of NORM_THREADS sums the squares of x[t],
    x[t + NORM_THREADS], ... in order; a halving tree sums the threads;
    y = x * (1 / sqrt(sum / D + eps)) * w."""
    threads = define("NORM_THREADS")
    D = x.shape[-1]
    rows = x.reshape(-1, D)
    squares = np.pad(rows * rows, ((0, 0), (0, -D % threads))).reshape(len(rows), -1, threads)
    part = np.zeros((len(rows), threads), dtype=F32)
    for i in range(squares.shape[1]):
        part = part + squares[:, i]
    while part.shape[1] > 1:
        half = part.shape[1] // 2
        part = part[:, :half] + part[:, half:]
    r = F32(1) / np.sqrt(part[:, 0] / F32(D) + F32(eps))
    return (rows * r[:, None] * weight).reshape(x.shape)


def rope(x: np.ndarray, positions, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """Twin of ops.cu rope: x (n, H, Dh), pairs (i, i + Dh/2) when neox, else (2i, 2i + 1)."""
    half = x.shape[-1] // 2
    pos = np.asarray(positions, dtype=np.int64)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    first, second = (
        (slice(None, half), slice(half, None)) if neox else (slice(0, None, 2), slice(1, None, 2))
    )
    x0, x1 = x[..., first], x[..., second]
    y = np.empty_like(x)
    y[..., first] = x0 * c - x1 * s
    y[..., second] = x0 * s + x1 * c
    return y


def glu(gate_up: np.ndarray, d_ff: int, activation: str) -> np.ndarray:
    """Twin of ops.cu glu_silu / glu_gelu_tanh: act(gate) * up over gate_up (n, 2F)."""
    g, u = gate_up[:, :d_ff], gate_up[:, d_ff:]
    if activation == "silu":
        with np.errstate(over="ignore"):  # exp(-g) = inf below g = -88: g / inf = -0
            return g / (F32(1) + np.exp(-g)) * u
    if activation == "gelu_tanh":
        inner = F32(0.7978845608) * (g + F32(0.044715) * (g * g * g))
        return F32(0.5) * g * (F32(1) + np.tanh(inner)) * u
    raise KeyError(activation)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """Twin of ops.cu softcap: cap * tanh(x / cap)."""
    return F32(cap) * np.tanh(x / F32(cap))


def attention_decode(
    q, k, v, cache_k, cache_v, layer, slots, positions, scale, window=0, softcap=0.0
) -> np.ndarray:
    """Twin of attention.cu kv_write, attention_chunk and attention_combine: every row's
    k, v written into the caches (n_layer, n_slots, Hkv, n_ctx, Dh) first, then per row the
    visible positions lo..p cut at multiples of ATT_CHUNK; per chunk the maximum score m,
    l = sum exp(s - m) and o = sum exp(s - m) v; the chunks rescaled to their largest m and
    combined in order, o / l. Returns (B, H * Dh)."""
    chunk = define("ATT_CHUNK")
    B, H, Dh = q.shape
    Hkv = cache_k.shape[2]
    for b in range(B):
        cache_k[layer, slots[b], :, positions[b]] = k[b]
        cache_v[layer, slots[b], :, positions[b]] = v[b]
    out = np.empty((B, H * Dh), dtype=F32)
    for b in range(B):
        p = int(positions[b])
        lo = max(0, p + 1 - window) if window > 0 else 0
        qs = (q[b] * F32(scale)).reshape(Hkv, H // Hkv, 1, Dh)
        parts = []
        for c in range(lo // chunk, p // chunk + 1):
            visible = slice(max(lo, c * chunk), min(p, c * chunk + chunk - 1) + 1)
            keys = cache_k[layer, slots[b], :, visible]  # (Hkv, n, Dh)
            values = cache_v[layer, slots[b], :, visible]
            s = (qs * keys[:, None]).sum(-1)  # (Hkv, group, n)
            if softcap > 0:
                s = F32(softcap) * np.tanh(s / F32(softcap))
            m = s.max(-1, keepdims=True)
            e = np.exp(s - m)
            o = (e[..., None] * values[:, None]).sum(-2)  # (Hkv, group, Dh)
            parts.append((m.reshape(H, 1), e.sum(-1).reshape(H, 1), o.reshape(H, Dh)))
        top = np.max([m for m, _, _ in parts], axis=0)
        total, weighted = np.zeros((H, 1), F32), np.zeros((H, Dh), F32)
        for m, denominator, o in parts:
            w = np.exp(m - top)
            total = total + denominator * w
            weighted = weighted + o * w
        out[b] = (weighted / total).reshape(-1)
    return out
