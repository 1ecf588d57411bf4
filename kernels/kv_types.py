"""The KV cache's storage types (the `kv_dtype` load option) and their numpy codec.

"f32" keeps keys and values as float32 (exact: the default); "f16" as float16 (half the
bytes); "q8_0" as GGUF's Q8_0 blocks along each head's row (32 values share one float16
scale: 34 bytes for 32 values, ~3.8x fewer than float32). A cache row is one position of
one KV head; the storage array's last axis holds that row in the storage type (Dh float32,
Dh float16, or Dh / 32 * 34 bytes). The compiled kernels (kernels/cpu/kv.c) write and read
the same bytes: `encode` here rounds exactly as they do, so either side may have written a
row the other reads.
"""

from __future__ import annotations

import numpy as np

KV_DTYPES = ("f32", "f16", "q8_0")
DEFAULT_KV_DTYPE = "f32"
Q8_BLOCK = 32  # values per Q8_0 block
Q8_BLOCK_BYTES = 2 + Q8_BLOCK  # a float16 scale, then 32 int8 values


def check_kv_dtype(name: object) -> str:
    """`name` when it is a KV type; ValueError saying which ones there are otherwise."""
    if name not in KV_DTYPES:
        raise ValueError(f"kv_dtype {name!r} is not one of {', '.join(KV_DTYPES)}")
    return str(name)


def fits(kv_dtype: str, head_dim: int) -> str | None:
    """Why a head of `head_dim` values cannot be stored as `kv_dtype` (None: it can)."""
    if kv_dtype == "q8_0" and head_dim % Q8_BLOCK:
        return f"kv_dtype q8_0 needs a head dimension that is a multiple of 32 (this model's is {head_dim})"
    return None


def storage(kv_dtype: str, head_dim: int, dtype=np.float32) -> tuple[np.dtype, int]:
    """(element type, elements per row) of the storage array; `dtype`: f32's element type
    (the backend's float type)."""
    if kv_dtype == "f16":
        return np.dtype(np.float16), head_dim
    if kv_dtype == "q8_0":
        return np.dtype(np.uint8), head_dim // Q8_BLOCK * Q8_BLOCK_BYTES
    return np.dtype(dtype), head_dim


def row_bytes(kv_dtype: str, head_dim: int) -> int:
    """Bytes of one position of one KV head (float32 for f32)."""
    element, n = storage(kv_dtype, head_dim)
    return n * element.itemsize


def encode(xp, x, kv_dtype: str):
    """Rows x (..., Dh) float32 in the storage type (..., row). f16: rounded to nearest
    even; q8_0: d = max|x| / 127 per block, q = x / d rounded half away from zero, d kept
    as float16 (kernels/cpu/kv.c's store_q8)."""
    if kv_dtype == "f16":
        return x.astype(np.float16)
    if kv_dtype != "q8_0":
        return x
    x = xp.asarray(x, dtype=np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, Q8_BLOCK)
    d = xp.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127.0)
    ratio = blocks / xp.where(d == 0, np.float32(1.0), d)  # float32, as C's x / d
    q = xp.where(d == 0, 0.0, xp.sign(ratio) * xp.floor(xp.abs(ratio).astype(np.float64) + 0.5))
    out = xp.empty((*blocks.shape[:-1], Q8_BLOCK_BYTES), dtype=np.uint8)
    out[..., :2] = d.astype(np.float16).view(np.uint8)
    out[..., 2:] = q.astype(np.int8).view(np.uint8)
    return out.reshape(*x.shape[:-1], -1)


def decode(xp, rows, kv_dtype: str):
    """Stored rows (..., row) back to float32 (..., Dh): exact conversions (d * q for q8_0),
    the values the compiled kernels compute with."""
    if kv_dtype == "f16":
        return rows.astype(np.float32)
    if kv_dtype != "q8_0":
        return rows
    blocks = xp.ascontiguousarray(rows).reshape(*rows.shape[:-1], -1, Q8_BLOCK_BYTES)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    q = blocks[..., 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(*rows.shape[:-1], -1)
