"""qwen3moe (the mixture-of-experts FFN, engine/models/_moe.py) against a float32
transformers reference (tests/reference/tiny/tiny_moe_f32.json, scripts/reference_moe.py):
logits within 1e-2, greedy identical where the reference's margin allows, on every
backend; decode rows bitwise the same alone or batched; packed prefill bitwise each
chunk alone; the experts read from the file's blocks in place."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module, supported_architectures
from engine.models._moe import MoeParams, MoeWeights
from kernels import get_backend
from kernels.moe import route
from kernels.reference.backend import NumpyBackend
from kernels.xp.backend import XpBackend
from tests.engine.models.test_architectures import greedy
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance
from tests.engine.models.test_dense_llamacpp import LLAMA_CPP_TOLERANCE, check_against_llama_cpp
from tests.engine.models.test_packed_prefill import _assert_packed_is_alone

PATH = TINY / "tiny-qwen3moe.gguf"
MARGIN_FLOOR = 0.05  # greedy ids must agree up to the first step the reference nearly ties


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((TINY / "tiny_moe_f32.json").read_text("utf-8"))["models"][0]


def _cpu():
    try:
        return get_backend("cpu")
    except ValueError as exc:
        pytest.skip(str(exc))


BACKENDS = {"numpy": NumpyBackend, "cpu": _cpu, "xp": XpBackend}


def load(backend=None):
    gf = GGUFFile(PATH)
    return architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.fixture(scope="module")
def cpu_model():
    return load(_cpu())


def test_qwen3moe_is_a_supported_architecture():
    assert "qwen3moe" in supported_architectures()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_tiny_qwen3moe_matches_the_float32_reference(backend, reference):
    assert hashlib.sha256(PATH.read_bytes()).hexdigest() == reference["sha256"]
    model = load(BACKENDS[backend]())
    # the compiled backend's one-call decode step routes in C (kernels/cpu/mixture.c)
    assert (model.decode_stack is not None) == (backend == "cpu")
    for case in reference["cases"]:
        check_case(model, case)


def check_case(model, case: dict) -> None:
    """One reference case (tiny_*_f32.json): every position's max logit and argmax, the
    last position's top-5 within 1e-2, greedy ids up to the reference's first near tie."""
    prompt = case["prompt_ids"]
    logits = model.forward(np.asarray(prompt), 0, model.make_kv_cache(1, 64), 0, all_logits=True)
    np.testing.assert_allclose(logits.max(-1), case["per_position_max_logit"], atol=1e-2)
    assert logits.argmax(-1).tolist() == case["per_position_argmax"]
    top5 = logits[-1][case["last_logits_top5_ids"]]
    np.testing.assert_allclose(top5, case["last_logits_top5"], atol=1e-2)
    expected, margins = case["greedy_ids"], case["top1_top2_margin"]
    got, _ = greedy(model, prompt, len(expected))
    tie = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(expected))
    assert got[:tie] == expected[:tie]


def test_moe_decode_rows_are_bitwise_the_same_alone_or_batched(cpu_model):
    check_batch_invariance(cpu_model, 256, [3, 5, 9, 2, 12, 7, 4, 6])


def test_moe_decode_on_the_numpy_reference_is_batch_invariant_too():
    check_batch_invariance(load(NumpyBackend()), 256, [4, 2, 7, 3, 5, 1, 6, 8])


def test_packed_moe_prefill_gives_each_chunk_its_own_bits(cpu_model):
    # Each chunk's tokens are grouped by expert on their own: the row counts (and so the
    # kernels) its own pass would use.
    _assert_packed_is_alone(cpu_model)


def test_the_experts_are_views_of_the_files_blocks(cpu_model):
    gf = GGUFFile(PATH)
    moe = cpu_model.layers[1].moe
    assert moe.params == MoeParams(n_expert=8, n_used=2, d_ff=96, gating="softmax", norm_topk=True)
    assert len(moe.gate_up) == len(moe.down) == 8
    assert moe.down[5].storage == "Q8_0" and moe.down[5].shape == (64, 96)
    stack = gf.load_blocks("blk.1.ffn_down_exps.weight")  # (8 * 64, bytes per row)
    np.testing.assert_array_equal(moe.down[5].data, stack[5 * 64 : 6 * 64])
    assert not moe.down[5].data.flags.owndata  # the file's map, viewed
    stacked_bytes = sum(
        gf.stored_bytes(f"blk.1.ffn_{p}_exps.weight") for p in ("gate", "up", "down")
    )
    assert moe.nbytes == stacked_bytes + gf.stored_bytes("blk.1.ffn_gate_inp.weight")


def test_routing_picks_the_top_k_and_renormalises():
    logits = np.array([[0.0, 2.0, 1.0, -1.0], [1.0, 1.0, 1.0, 0.0]], dtype=np.float32)
    chosen, weights = route(logits, 2, "softmax", norm_topk=True)
    assert chosen.tolist() == [[1, 2], [0, 1]]  # a tie goes to the lower expert id
    e = np.exp([2.0, 1.0])
    np.testing.assert_allclose(weights[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(weights[1], [0.5, 0.5], rtol=1e-6)
    # Without renormalising, the softmax over all experts; sigmoid gating likewise per expert.
    full = np.exp(logits[0] - 2.0) / np.exp(logits[0] - 2.0).sum()
    np.testing.assert_allclose(route(logits, 2, "softmax", False)[1][0], full[[1, 2]], rtol=1e-6)
    sigmoid = route(logits, 2, "sigmoid", norm_topk=False, scale=2.0)[1][0]
    np.testing.assert_allclose(sigmoid, 2.0 / (1.0 + np.exp(-np.array([2.0, 1.0]))), rtol=1e-6)
    with pytest.raises(ValueError, match="gating"):
        route(logits, 2, "relu", norm_topk=True)


def test_a_row_routes_the_same_alone_or_batched():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((33, 128)).astype(np.float32)
    chosen, weights = route(logits, 8, "softmax", norm_topk=True)
    for row in (0, 7, 32):
        one_chosen, one_weights = route(logits[row : row + 1], 8, "softmax", norm_topk=True)
        assert np.array_equal(one_chosen[0], chosen[row])
        assert np.array_equal(one_weights[0], weights[row])


def test_the_mixture_is_the_weighted_sum_of_its_experts_plus_the_shared_one():
    """MoeWeights.forward against the formula written out row by row in numpy, with a
    shared expert (the hook no shipped architecture uses yet) and a packed prefill's
    segments."""
    be, rng = NumpyBackend(), np.random.default_rng(5)
    D, F, E, k = 16, 8, 6, 3
    gate, up = rng.standard_normal((2, E, F, D)).astype(np.float32)
    down = rng.standard_normal((E, D, F)).astype(np.float32)
    router = rng.standard_normal((E, D)).astype(np.float32)
    shared = rng.standard_normal((2 * F, D)).astype(np.float32)
    shared_down = rng.standard_normal((D, F)).astype(np.float32)
    moe = MoeWeights(
        params=MoeParams(n_expert=E, n_used=k, d_ff=F, gating="softmax", norm_topk=True),
        router=be.dense_weight(router),
        gate_up=[be.dense_weight(np.concatenate([gate[e], up[e]])) for e in range(E)],
        down=[be.dense_weight(down[e]) for e in range(E)],
        shared_gate_up=be.dense_weight(shared),
        shared_down=be.dense_weight(shared_down),
    )

    def silu(v):
        return v / (1.0 + np.exp(-v))

    x = rng.standard_normal((7, D)).astype(np.float32)
    expected = []
    for row in x.astype(np.float64):
        logits = router @ row
        probs = np.exp(logits - logits.max())
        top = np.argsort(-probs)[:k]
        weights = probs[top] / probs[top].sum()
        out = sum(
            w * (down[e] @ (silu(gate[e] @ row) * (up[e] @ row)))
            for w, e in zip(weights, top, strict=True)
        )
        expected.append(out + shared_down @ (silu(shared[:F] @ row) * (shared[F:] @ row)))

    class Rows:  # a Decode-like step: the row kernel
        linear = staticmethod(be.linear)

    class Packed(Rows):  # a packed prefill of two chunks: (slot, start, rows)
        chunks = [(0, 0, 3), (1, 0, 4)]

    for step in (Rows(), Packed()):
        got = moe.forward(be, x, step, "silu")
        np.testing.assert_allclose(got, np.asarray(expected), rtol=2e-4, atol=2e-4)


def test_tiny_qwen3moe_agrees_with_llama_cpp(cpu_model):
    """The second reference (scripts/reference_llamacpp.py): llama.cpp reads the file as
    qwen3moe and computes the same function, to 1e-2 on an F32 copy of the file and to
    its activation rounding (Q8_1) on the file itself."""
    ref = json.loads((TINY / "tiny_moe_llamacpp.json").read_text("utf-8"))["models"][0]
    check_against_llama_cpp(cpu_model, ref, LLAMA_CPP_TOLERANCE)
