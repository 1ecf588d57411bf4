"""The compiled CPU backend's fused decode step with mixture-of-experts layers
(kernels/cpu/mixture.c): bitwise the per-op path (which routes with the same C), rows
the same bits alone or batched, for one thread or two; its routing is kernels/moe.py's
rule."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.moe import route
from tests.engine.models.test_batch_invariance import TINY
from tests.engine.models.test_fused_decode import _check, _prefilled
from tests.engine.models.test_fused_decode import _load as load_path


def _load(name, backend):
    return load_path(TINY / name, backend)


@pytest.fixture
def threads(cpu):
    """Set the kernels' thread count for a test; restored after."""
    before = cpu.ext.get_threads()
    yield cpu.ext.set_threads
    cpu.ext.set_threads(before)


def test_tiny_qwen3moe_fused_step_is_the_per_op_step_bitwise(cpu):
    model = _load("tiny-qwen3moe.gguf", cpu)
    assert all(layer.moe is not None for layer in model.layers)
    _check(model)  # B = 1, 3, 8 over a few steps, logits and KV caches bitwise


def _steps(model, kv, slots, lengths, n_steps=3):
    """Logits of n_steps fused decode steps of rows `slots` (lengths advanced in place)."""
    out = []
    for step in range(n_steps):
        tokens = [(11 * s + 5 * step + 1) % 200 for s in slots]
        out.append(model.forward_decode(tokens, [lengths[s] for s in slots], slots, kv))
        for s in slots:
            lengths[s] += 1
    return out


def test_fused_moe_rows_are_the_same_alone_or_batched_on_one_thread_or_two(cpu, threads):
    model = _load("tiny-qwen3moe.gguf", cpu)
    lengths0 = [5, 17, 40, 9, 33, 2, 61, 12]
    runs = {}
    for nt in (1, 2):
        threads(nt)
        kv, _ = _prefilled(model, 8, 96, lengths0)
        runs[nt, "batched"] = np.stack(_steps(model, kv, list(range(8)), list(lengths0)))
        kv, _ = _prefilled(model, 8, 96, lengths0)
        alone = [np.stack(_steps(model, kv, [s], list(lengths0)))[:, 0] for s in range(8)]
        runs[nt, "alone"] = np.stack(alone, axis=1)
    first = runs[1, "batched"]
    for key, got in runs.items():
        assert np.array_equal(got, first), f"{key}: max diff {np.abs(got - first).max()}"


def test_a_shared_expert_runs_in_the_fused_step_as_per_op(cpu):
    # No shipped file has one: expert 0's gate/up and expert 1's down serve as the shared
    # expert of every layer, and the plan is made again.
    model = _load("tiny-qwen3moe.gguf", cpu)
    for layer in model.layers:
        layer.moe.shared_gate_up = layer.moe.gate_up[0]
        layer.moe.shared_down = layer.moe.down[1]
    model.decode_stack = cpu.decode_stack(model.layers, model.hp, model.spec)
    _check(model)


@pytest.mark.parametrize(
    ("gating", "norm_topk", "scale"),
    [
        ("softmax", True, 1.0),
        ("softmax", False, 2.5),
        ("sigmoid", True, 1.0),
        ("sigmoid", False, 0.5),
        ("softmax_topk", False, 1.0),
    ],
)
def test_the_compiled_routing_is_the_reference_rule(cpu, gating, norm_topk, scale):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((40, 64)).astype(np.float32)
    logits[5, [3, 9, 40]] = logits[5].max() + 1.0  # a three-way tie: lower ids first
    want_chosen, want_weights = route(logits, 8, gating, norm_topk, scale)
    chosen, weights = cpu.route(logits, 8, gating, norm_topk, scale)
    assert np.array_equal(chosen, want_chosen)
    assert chosen[5, :3].tolist() == [3, 9, 40]
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6)
    one_chosen, one_weights = cpu.route(logits[5:6], 8, gating, norm_topk, scale)
    assert np.array_equal(one_chosen[0], chosen[5]) and np.array_equal(one_weights[0], weights[5])
    with pytest.raises(ValueError, match="gating"):
        cpu.route(logits, 8, "relu", True)


def test_gpt_oss_keeps_the_per_op_step(cpu):
    # Attention sinks, expert biases and the clamped SwiGLU: not in the fused step.
    assert _load("tiny-gptoss.gguf", cpu).decode_stack is None


@pytest.mark.parametrize("mode", ["bfloat16", "avx2", "generic"])
def test_the_fused_moe_step_is_the_per_op_step_in_every_kernel_mode(cpu, mode):
    """bfloat16 products (each expert's gathered rows rounded as cpu_linear rounds them),
    and the AVX2 and portable kernels."""
    from kernels.cpu.backend import configure_activations

    ext = cpu.ext
    if mode == "bfloat16" and mode not in ext.supported_activations():
        pytest.skip("this CPU has no AVX-512 BF16")
    if mode != "bfloat16" and mode not in ext.supported_isas():
        pytest.skip(f"this CPU does not run the {mode} kernels")
    isa = ext.isa()
    try:
        if mode == "bfloat16":
            assert configure_activations("bfloat16") == "bfloat16"
        else:
            ext.set_isa(mode)
        _check(_load("tiny-qwen3moe.gguf", cpu))
    finally:
        configure_activations("float32")
        ext.set_isa(isa)


def test_a_malformed_mixture_is_left_to_the_per_op_path(cpu):
    # The plan checks every expert's shape once; what it refuses runs per op (which says
    # what is wrong when it runs).
    model = _load("tiny-qwen3moe.gguf", cpu)
    model.layers[1].moe.gate_up.pop()  # 7 experts' gate/up for 8 router rows
    assert cpu.decode_stack(model.layers, model.hp, model.spec) is None


def test_a_prefill_runs_each_mixture_layer_in_one_compiled_call(cpu, monkeypatch):
    """A prefill's mixture layers go through the fused plan's mixture (one call a layer,
    not one per expert and prompt): a prompt's logits are the same bits alone or packed
    with others, and within 1e-4 of the per-op products (PANTHEON_CPU_FUSED_DECODE=0: no
    plan, no compiled call)."""
    model = _load("tiny-qwen3moe.gguf", cpu)
    assert all(layer.moe.prefill_ffn is not None for layer in model.layers)
    calls = []
    for layer in model.layers:
        ffn = layer.moe.prefill_ffn
        layer.moe.prefill_ffn = lambda h, ffn=ffn: calls.append(len(h)) or ffn(h)
    prompts = [(np.arange(n) * (s + 3) + 1) % 200 for s, n in enumerate((40, 23, 57))]
    kv = model.make_kv_cache(3, 96)
    alone = [model.forward(p, 0, kv, s) for s, p in enumerate(prompts)]
    assert calls == [n for n in (40, 23, 57) for _ in model.layers]
    kv = model.make_kv_cache(3, 96)
    packed = model.forward_packed([(p, 0, s) for s, p in enumerate(prompts)], kv)
    for a, b in zip(alone, packed, strict=True):
        assert np.array_equal(a, b)

    monkeypatch.setenv("PANTHEON_CPU_FUSED_DECODE", "0")
    per_op = _load("tiny-qwen3moe.gguf", cpu)
    assert all(layer.moe.prefill_ffn is None for layer in per_op.layers)
    kv = per_op.make_kv_cache(3, 96)
    for s, p in enumerate(prompts):
        np.testing.assert_allclose(per_op.forward(p, 0, kv, s), alone[s], rtol=1e-4, atol=1e-4)
