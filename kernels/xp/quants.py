"""GGUF blocks to float32 values over an array module `xp` (numpy, or CuPy on a GPU).

The GPU backend (issue 16) keeps matrices on the device in their GGUF block layout and
dequantises them there; these functions are that step written as array code, so the same
lines run on numpy in the normal suite and on CuPy where a GPU is. On numpy they are
bitwise gguf-py's dequantizers (the same operations in the same order; tests/kernels/
test_xp_quants.py). Only xp's own functions and array methods are used: a CuPy array
never meets a numpy one (CuPy refuses mixed operands).

`dequantize(xp, blocks, qtype)`: blocks (rows, bytes per row) uint8 on xp's device ->
(rows, values per row) float32 there.
"""

from __future__ import annotations

from collections.abc import Callable

from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

QK_K = 256


def _f16(xp, b, offset: int):
    """Bytes offset, offset + 1 of every block as float16 -> float32, shape (n, 1)."""
    return xp.ascontiguousarray(b[:, offset : offset + 2]).view(xp.float16).astype(xp.float32)


def _nibbles(xp, qs):
    """(n, 16) bytes -> (n, 32): the low nibbles, then the high ones (GGUF's order)."""
    return xp.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(xp, b, offset: int, count: int):
    """The uint32 at offset of every block -> (n, count) bits 0 .. count - 1, uint8."""
    qh = xp.ascontiguousarray(b[:, offset : offset + 4]).view(xp.uint32)
    shifts = xp.arange(count, dtype=xp.uint32).reshape(1, count)
    return ((qh >> shifts) & 1).astype(xp.uint8)


def _q4_0(xp, b):
    d = _f16(xp, b, 0)
    q = _nibbles(xp, b[:, 2:18]).astype(xp.int8) - xp.int8(8)
    return d * q.astype(xp.float32)


def _q4_1(xp, b):
    d, m = _f16(xp, b, 0), _f16(xp, b, 2)
    return (d * _nibbles(xp, b[:, 4:20]).astype(xp.float32)) + m


def _q5_0(xp, b):
    d = _f16(xp, b, 0)
    q = (_nibbles(xp, b[:, 6:22]) | (_high_bits(xp, b, 2, 32) << 4)).astype(xp.int8)
    return d * (q - xp.int8(16)).astype(xp.float32)


def _q5_1(xp, b):
    d, m = _f16(xp, b, 0), _f16(xp, b, 2)
    q = _nibbles(xp, b[:, 8:24]) | (_high_bits(xp, b, 4, 32) << 4)
    return (d * q.astype(xp.float32)) + m


def _q8_0(xp, b):
    d = _f16(xp, b, 0)
    return xp.ascontiguousarray(b[:, 2:34]).view(xp.int8).astype(xp.float32) * d


def _k_scales(xp, s):
    """Q4_K / Q5_K's 12 scale bytes -> the 8 sub-blocks' 6-bit scales and mins (n, 8)."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = xp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = xp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _k_affine(xp, b, q):
    """(d * sc) * q - dmin * m over 8 sub-blocks of 32: q (n, 8, 32) float32."""
    n = b.shape[0]
    sc, mn = _k_scales(xp, b[:, 4:16])
    d = (_f16(xp, b, 0) * sc.astype(xp.float32)).reshape(n, 8, 1)
    dm = (_f16(xp, b, 2) * mn.astype(xp.float32)).reshape(n, 8, 1)
    return (d * q - dm).reshape(n, QK_K)


def _k_nibbles(xp, qs):
    """(n, 128) bytes -> (n, 8, 32): per 32 bytes, the low nibbles then the high ones."""
    n = qs.shape[0]
    qs = qs.reshape(n, 4, 1, 32)
    return xp.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)


def _q4_k(xp, b):
    return _k_affine(xp, b, _k_nibbles(xp, b[:, 16:144]).astype(xp.float32))


def _q5_k(xp, b):
    n = b.shape[0]
    shifts = xp.arange(8, dtype=xp.uint8).reshape(1, 8, 1)
    qh = (b[:, 16:48].reshape(n, 1, 32) >> shifts) & 1  # (n, 8, 32): bit j of sub-block j
    q = _k_nibbles(xp, b[:, 48:176]) | (qh << 4)
    return _k_affine(xp, b, q.astype(xp.float32))


def _q6_k(xp, b):
    n = b.shape[0]
    scales = xp.ascontiguousarray(b[:, 192:208]).view(xp.int8).astype(xp.float32)
    d = (_f16(xp, b, 208) * scales).reshape(n, QK_K // 16, 1)
    ql = b[:, 0:128].reshape(n, 2, 1, 64)
    ql = xp.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 8, 32)
    shifts = xp.asarray([0, 2, 4, 6], dtype=xp.uint8).reshape(1, 1, 4, 1)
    qh = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    q = (ql | (qh << 4)).astype(xp.int8) - xp.int8(32)
    return (d * q.reshape(n, QK_K // 16, 16).astype(xp.float32)).reshape(n, QK_K)


def _f32(xp, b):
    return xp.ascontiguousarray(b).view(xp.float32)


def _f16_values(xp, b):
    return xp.ascontiguousarray(b).view(xp.float16).astype(xp.float32)


def _bf16(xp, b):
    return (xp.ascontiguousarray(b).view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)


# qtype -> blocks (n, type size) -> values (n, block size)
DEQUANTIZERS: dict[Q, Callable] = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
    Q.F32: _f32,
    Q.F16: _f16_values,
    Q.BF16: _bf16,
}


def supports(qtype: Q) -> bool:
    return qtype in DEQUANTIZERS


def dequantize(xp, blocks, qtype: Q):
    """blocks (rows, bytes per row) uint8 -> (rows, values per row) float32, on xp."""
    try:
        fn = DEQUANTIZERS[qtype]
    except KeyError:
        raise ValueError(f"no array-code dequantizer for {qtype.name}") from None
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows, row_bytes = blocks.shape
    if row_bytes % type_size:
        raise ValueError(f"{qtype.name} rows of {row_bytes} bytes are not whole blocks")
    per_row = row_bytes // type_size * block_size
    b = xp.ascontiguousarray(blocks).reshape(-1, type_size)
    return fn(xp, b).reshape(rows, per_row)
