"""The compiled backend's fused decode step (every layer in one C call) gives the per-op
path's bits, for every architecture's block (biases, q/k norms, sandwich norms, GELU,
sliding windows) and any batch of slots and positions."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels import get_backend


def _load(path, backend):
    gf = GGUFFile(path)
    return architecture_module(gf.architecture).load(gf, backend=backend)


def _prefilled(model, n_slots: int, n_ctx: int, lengths):
    """Two identical KV caches, slot s holding a prompt of lengths[s] tokens."""
    kv = model.make_kv_cache(n_slots, n_ctx)
    for slot, n in enumerate(lengths):
        model.forward((np.arange(n) * (slot + 3) + 1) % 200, 0, kv, slot)
    twin = model.make_kv_cache(n_slots, n_ctx)
    twin.k[...] = kv.k
    twin.v[...] = kv.v
    return kv, twin


def _both_paths(model, tokens, positions, slots, kv, twin):
    fused = model.decode_stack
    assert fused is not None, "the compiled backend should fuse this model's decode step"
    try:
        a = model.forward_decode(tokens, positions, slots, kv)
        model.decode_stack = None
        b = model.forward_decode(tokens, positions, slots, twin)
    finally:
        model.decode_stack = fused
    return a, b


def _check(model, n_ctx=96):
    lengths = [5, 17, 40, 9, 33, 2, 61, 12]
    kv, twin = _prefilled(model, 8, n_ctx, lengths)
    for B in (1, 3, 8):
        slots = list(range(8))[-B:]
        positions = [lengths[s] for s in slots]
        tokens = [(7 * s + 3) % 200 for s in slots]
        a, b = _both_paths(model, tokens, positions, slots, kv, twin)
        assert a.shape == (B, b.shape[1])
        assert np.array_equal(a, b), f"B={B}: max diff {np.abs(a - b).max()}"
        assert np.array_equal(kv.k, twin.k) and np.array_equal(kv.v, twin.v)
        for s in slots:
            lengths[s] += 1


def test_smollm2_fused_step_is_the_per_op_step_bitwise(smollm2_path, cpu):
    _check(_load(smollm2_path, cpu))


def test_gemma3_fused_step_is_the_per_op_step_bitwise(gemma3_path, cpu):
    # sandwich norms, q/k norms, GELU, sliding-window layers, two RoPE tables
    model = _load(gemma3_path, cpu)
    assert any(layer.window for layer in model.layers)
    _check(model, n_ctx=700)  # past gemma3-270m's 512-token window


@pytest.mark.parametrize("name", ["tiny-qwen2.gguf", "tiny-qwen3.gguf"])
def test_tiny_qwen_fused_step_is_the_per_op_step_bitwise(name, reference_dir, cpu):
    # qwen2: q/k/v biases; qwen3: per-head q/k RMSNorm; both neox RoPE
    _check(_load(reference_dir / "tiny" / name, cpu))


def test_the_numpy_reference_has_no_fused_step(smollm2_path):
    assert _load(smollm2_path, get_backend("numpy")).decode_stack is None


def test_the_fused_step_refuses_rows_outside_the_cache(smollm2_path, cpu):
    model = _load(smollm2_path, cpu)
    kv = model.make_kv_cache(2, 32)
    x = np.zeros((1, model.hp.d_model), dtype=np.float32)
    for slots, positions in (([2], [0]), ([0], [32]), ([-1], [0]), ([0], [-1])):
        with pytest.raises(ValueError, match="outside the cache"):
            model.decode_stack(x, slots, positions, kv)
    with pytest.raises(ValueError, match="x must be"):
        model.decode_stack(np.zeros((1, 7), dtype=np.float32), [0], [0], kv)
    with pytest.raises(ValueError, match="slots, positions"):
        model.decode_stack(x, [0, 1], [0, 1], kv)
