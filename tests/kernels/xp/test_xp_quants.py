"""The GPU backend's dequantisation as array code (kernels/xp/quants.py), run with
xp = numpy: bitwise gguf-py's for every type the shipped and test models use, on random
blocks (every byte pattern below 0x3C, so scales stay finite, and bytes from gguf's own
quantiser where it has one), odd row counts and rows of several blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from kernels.xp import quants as xp_quants
from tests.tiny_gguf import random_blocks

TYPES = sorted(xp_quants.DEQUANTIZERS, key=lambda q: q.name)
QUANTISED_BY_GGUF = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16}


def gguf_values(blocks: np.ndarray, qtype: Q) -> np.ndarray:
    return quants.dequantize(blocks, qtype).astype(np.float32, copy=False)


def as_bytes(values: np.ndarray, qtype: Q) -> np.ndarray:
    """A float type's values as the (rows, bytes) uint8 a GGUF file maps."""
    return np.ascontiguousarray(values).view(np.uint8).reshape(values.shape[0], -1)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("rows, blocks_per_row", [(1, 1), (7, 3), (33, 2)])
def test_random_blocks_dequantise_bitwise_as_gguf(qtype, rows, blocks_per_row):
    block = 256 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 32
    cols = block * blocks_per_row
    blocks = random_blocks(f"xp-{qtype.name}-{rows}", (rows, cols), qtype)
    if qtype == Q.F32:  # random bytes are not all finite floats: values, as bytes
        values = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
        blocks = as_bytes(values, qtype)
    ours = xp_quants.dequantize(np, blocks, qtype)
    ref = gguf_values(blocks.view(np.float32) if qtype == Q.F32 else blocks, qtype)
    if qtype == Q.F16:
        ref = blocks.view(np.float16).astype(np.float32)
    assert ours.dtype == np.float32 and ours.shape == (rows, cols)
    assert np.array_equal(ours.view(np.uint32), ref.reshape(rows, cols).view(np.uint32))


@pytest.mark.parametrize("qtype", sorted(QUANTISED_BY_GGUF, key=lambda q: q.name), ids=str)
def test_blocks_from_ggufs_quantiser_dequantise_bitwise_as_gguf(qtype):
    values = np.random.default_rng(3).standard_normal((5, 96)).astype(np.float32)
    blocks = quants.quantize(values, qtype)
    blocks = blocks.view(np.uint8).reshape(5, -1)
    ours = xp_quants.dequantize(np, blocks, qtype)
    assert np.array_equal(ours.view(np.uint32), gguf_values(blocks, qtype).view(np.uint32))
    assert np.abs(ours - values).max() < 0.5  # and they are the values quantised


def test_a_row_that_is_not_whole_blocks_or_a_type_without_code_is_refused():
    with pytest.raises(ValueError, match="not whole blocks"):
        xp_quants.dequantize(np, np.zeros((2, 19), np.uint8), Q.Q4_1)
    with pytest.raises(ValueError, match="no array-code dequantizer for IQ2_XXS"):
        xp_quants.dequantize(np, np.zeros((1, 66), np.uint8), Q.IQ2_XXS)
    assert xp_quants.supports(Q.Q6_K) and not xp_quants.supports(Q.Q2_K)
