"""The batch-invariant decode matmul: a row's result is the same bits in any batch."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.reference import backend as ops

# SmolLM2-135M's decode matmuls (out, in), and its tied output matrix.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_row_is_bitwise_the_same_alone_and_beside_up_to_seven_others(shape):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(np.float32)
    chunks = ops.row_chunks(w)
    x = rng.standard_normal((8, shape[1]), dtype=np.float32)
    alone = [ops.linear_rows(x[b : b + 1], w, chunks)[0] for b in range(8)]
    for B in range(1, 9):
        batch = ops.linear_rows(x[:B], w, chunks)
        for b in range(B):
            assert np.array_equal(batch[b], alone[b]), (shape, B, b)
    # Position in the batch and the neighbours' values do not matter either.
    order = [3, 7, 0, 5]
    mixed = ops.linear_rows(np.concatenate([x[order], np.zeros_like(x[:2])]), w, chunks)
    for j, b in enumerate(order):
        assert np.array_equal(mixed[j], alone[b])
    np.testing.assert_allclose(alone[0], x[0] @ w.T, rtol=1e-4, atol=1e-4)


def test_row_chunks_cover_the_matrix_in_fixed_ranges():
    w = np.zeros((49152, 576), dtype=np.float32)
    chunks = ops.row_chunks(w)
    assert chunks[0][0] == 0 and chunks[-1][1] == 49152
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
    assert all((end - begin) % 64 == 0 for begin, end in chunks[:-1])
