"""Helpers shared by the CUDA kernel tests on a device (tests/gpu/test_cuda_kernels.py) and
on the host emulator (tests/kernels/cuda/test_cuda_emulated.py). Plain numpy and gguf: the GPU
machine imports it without Django."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

from kernels.cuda import kernels as cuda_kernels
from tests.tiny_gguf import random_blocks


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def blocks_of(tag: str, qtype: Q, rows: int, k: int) -> np.ndarray:
    """Random valid blocks of `qtype` (rows, k), seeded by `tag` and the type."""
    if qtype == Q.F32:  # random bytes are not all finite floats
        values = np.random.default_rng(rows + k).standard_normal((rows, k)).astype(np.float32)
        return values.view(np.uint8).reshape(rows, -1)
    return random_blocks(f"{tag}-{qtype.name}", (rows, k), qtype)


def width(qtype: Q) -> int:
    """Two whole warps of 256 and, for the 32-value types, a tail of idle lanes."""
    return 512 if qtype in cuda_kernels.K_QUANTS else 544
