"""A whole model over a float16 or Q8_0 KV cache (SmolLM2, compiled kernels): the fused
decode step gives the per-op step's bits, and a row's logits are the same bits alone or
in a batch of other slots, as with float32."""

from __future__ import annotations

import numpy as np
import pytest

LENGTHS = [5, 17, 40, 9]


def prefilled(model, kv_dtype: str):
    kv = model.make_kv_cache(len(LENGTHS), 64, kv_dtype)
    assert kv.kv_dtype == kv_dtype
    for slot, n in enumerate(LENGTHS):
        model.forward((np.arange(n) * (slot + 3) + 1) % 200, 0, kv, slot)
    return kv


def copy_of(model, kv, kv_dtype: str):
    twin = model.make_kv_cache(len(LENGTHS), 64, kv_dtype)
    twin.k[...], twin.v[...] = kv.k, kv.v
    return twin


@pytest.mark.parametrize("kv_dtype", ["f16", "q8_0"])
def test_narrow_kv_decode_is_fused_exactly_and_batch_invariant(smollm2_service, kv_dtype):
    model = smollm2_service.model
    if model.backend.name != "cpu" or model.decode_stack is None:
        pytest.skip("needs the compiled CPU kernels' fused decode step")
    kv = prefilled(model, kv_dtype)
    slots = list(range(len(LENGTHS)))
    tokens, positions = [(7 * s + 3) % 200 for s in slots], [LENGTHS[s] for s in slots]
    twin = copy_of(model, kv, kv_dtype)
    batch = model.forward_decode(tokens, positions, slots, kv)
    fused = model.decode_stack
    try:
        model.decode_stack = None
        per_op = model.forward_decode(tokens, positions, slots, twin)
    finally:
        model.decode_stack = fused
    assert np.array_equal(batch, per_op)
    assert np.array_equal(kv.k, twin.k) and np.array_equal(kv.v, twin.v)
    for s in slots:
        alone_kv = copy_of(model, twin, kv_dtype)
        # Back to the state before the step: the row's own position is rewritten anyway.
        alone = model.forward_decode([tokens[s]], [positions[s]], [s], alone_kv)
        assert np.array_equal(alone[0], batch[s]), (kv_dtype, s)
