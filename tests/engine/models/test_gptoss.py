"""gpt-oss (engine/models/gpt_oss.py) against a float32 transformers reference
(tests/reference/tiny/tiny_gptoss_f32.json, scripts/reference_gptoss.py): attention sinks,
biases, alternating sliding-window (8) and full layers with prompts past the window, the
clamped SwiGLU, softmax over the top-k router logits, YaRN RoPE, MXFP4 experts. Logits
within 1e-2, greedy identical where the reference's margin allows, on every backend that
has sinks; decode rows bitwise the same alone or batched; packed prefill bitwise each
chunk alone; a backend without sinks refuses the file."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module, gpt_oss, supported_architectures
from engine.models._block import load_decoder
from engine.models._moe import MoeParams
from engine.models._yarn import read_yarn, yarn_factors
from engine.types import ModelLoadError
from kernels.moe import route
from kernels.reference.backend import NumpyBackend, swiglu_oai
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance
from tests.engine.models.test_moe import BACKENDS, _cpu, check_case
from tests.engine.models.test_packed_prefill import _assert_packed_is_alone

PATH = TINY / "tiny-gptoss.gguf"


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((TINY / "tiny_gptoss_f32.json").read_text("utf-8"))["models"][0]


def load(backend=None):
    gf = GGUFFile(PATH)
    return architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.fixture(scope="module")
def cpu_model():
    return load(_cpu())


def test_gpt_oss_is_a_supported_architecture():
    assert "gpt-oss" in supported_architectures()
    assert GGUFFile(PATH).architecture == "gpt-oss"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_tiny_gpt_oss_matches_the_float32_reference(backend, reference):
    assert hashlib.sha256(PATH.read_bytes()).hexdigest() == reference["sha256"]
    model = load(BACKENDS[backend]())
    assert model.decode_stack is None  # routing happens on the host, per op
    assert [layer.window for layer in model.layers] == [reference["window"], 0] * 2
    for case in reference["cases"]:
        prompt = case["prompt_ids"]
        assert len(prompt) > reference["window"]
        check_case(model, case)


def test_gpt_oss_decode_rows_are_bitwise_the_same_alone_or_batched(cpu_model):
    # Slots past the window of 8: the sliding layers hide part of each one's history.
    check_batch_invariance(cpu_model, 256, [3, 5, 9, 2, 12, 7, 4, 20])


def test_gpt_oss_decode_on_the_numpy_reference_is_batch_invariant_too():
    check_batch_invariance(load(NumpyBackend()), 256, [4, 2, 7, 3, 11, 1, 6, 16])


def test_packed_gpt_oss_prefill_gives_each_chunk_its_own_bits(cpu_model):
    _assert_packed_is_alone(cpu_model)


def test_the_file_s_parts_are_read(cpu_model):
    layer = cpu_model.layers[1]
    assert layer.attn_sinks.shape == (4,) and layer.attn_output_bias.shape == (64,)
    assert layer.attn_qkv_bias.shape == (4 * 32 + 2 * 2 * 32,)
    moe = layer.moe
    assert moe.params == MoeParams(
        n_expert=8, n_used=4, d_ff=96, gating="softmax_topk", norm_topk=False
    )
    assert moe.router_bias.shape == (8,)
    assert len(moe.gate_up_bias) == len(moe.down_bias) == 8
    gf = GGUFFile(PATH)
    gate_b = gf.load_f32("blk.1.ffn_gate_exps.bias").reshape(8, 96)
    up_b = gf.load_f32("blk.1.ffn_up_exps.bias").reshape(8, 96)
    np.testing.assert_array_equal(moe.gate_up_bias[3], np.concatenate([gate_b[3], up_b[3]]))
    # The experts are MXFP4 blocks, multiplied in place by the compiled kernel.
    assert moe.down[5].storage == "MXFP4" and not moe.down[5].data.flags.owndata
    assert cpu_model.fallback_types == {}
    # YaRN: the file's factor 8 over an original context of 512 (cos and sin scaled).
    assert cpu_model.spec.rope_attn_factor == pytest.approx(0.1 * math.log(8.0) + 1.0)


def test_a_backend_without_sinks_refuses_the_file():
    class NoSinks(NumpyBackend):
        name = "nosinks"
        attention_sinks = False

    with pytest.raises(ModelLoadError, match="sinks"):
        load(NoSinks())


def test_softmax_topk_routing_softmaxes_only_the_chosen_logits():
    logits = np.array([[0.0, 2.0, 1.0, -1.0], [1.0, 1.0, 1.0, 0.0]], dtype=np.float32)
    chosen, weights = route(logits, 2, "softmax_topk", norm_topk=False)
    assert chosen.tolist() == [[1, 2], [0, 1]]  # a tie goes to the lower expert id
    e = np.exp([2.0, 1.0])
    np.testing.assert_allclose(weights[0], e / e.sum(), rtol=1e-6)
    np.testing.assert_allclose(weights[1], [0.5, 0.5], rtol=1e-6)
    # The same weights whatever the unchosen logits are (unlike a softmax over all).
    other = logits.copy()
    other[0, 3] = 0.5
    assert np.array_equal(route(other, 2, "softmax_topk", False)[1][0], weights[0])


def test_the_clamped_swiglu():
    gate = np.array([-3.0, 0.0, 2.0, 7.0, 50.0], dtype=np.float32)
    up = np.array([-50.0, 1.0, 0.5, 10.0, -2.0], dtype=np.float32)
    g = np.minimum(gate.astype(np.float64), 7.0)
    want = (np.clip(up, -7.0, 7.0) + 1.0) * g / (1.0 + np.exp(-1.702 * g))
    np.testing.assert_allclose(swiglu_oai(gate, up), want, rtol=1e-6, atol=1e-7)
    # The backends' glu over a fused (n, 2F) product, the compiled one included.
    gate_up = np.concatenate([gate, up])[None]
    for be in (NumpyBackend(), _cpu()):
        np.testing.assert_allclose(be.glu(gate_up, 5, "swiglu_oai")[0], want, rtol=1e-6)


def test_yarn_factors_keep_the_fast_frequencies_and_divide_the_slow_ones():
    factors, attn = yarn_factors(32, 150000.0, 8.0, 512, truncate=False)
    assert len(factors) == 16 and attn == pytest.approx(1.0 + 0.1 * math.log(8.0))
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(8.0)
    assert all(a <= b for a, b in zip(factors, factors[1:], strict=False))
    # truncate: the ramp's ends rounded to whole dimensions (llama.cpp's and
    # transformers' default), so more dimensions are whole-kept or whole-divided.
    rounded, _ = yarn_factors(32, 150000.0, 8.0, 512, truncate=True)
    assert sum(f in (1.0, 8.0) for f in rounded) >= sum(f in (1.0, 8.0) for f in factors)


def test_with_llama_cpp_s_yarn_rounding_it_computes_llama_cpp_s_function():
    """The second reference (`scripts/reference_llamacpp.py gptoss`): llama.cpp reads the
    file as gpt-oss (its tensor names and keys) and, on the file's F32 copy, computes what
    the engine computes once the engine rounds YaRN's ramp ends to whole dimensions as
    llama.cpp does. transformers' gpt-oss config (and OpenAI's own code) does not round,
    and the engine follows it: that one difference moves these logits by up to ~2.7."""
    ref = json.loads((TINY / "tiny_gptoss_llamacpp.json").read_text("utf-8"))["models"][0]
    assert hashlib.sha256(PATH.read_bytes()).hexdigest() == ref["sha256"]
    spec = dataclasses.replace(gpt_oss.SPEC, read_file=lambda gf: read_yarn(gf, truncate=True))
    model = load_decoder(GGUFFile(PATH), spec, backend=_cpu())
    for case in ref["f32_weights_cases"]:
        prompt = case["prompt_ids"]
        logits = model.forward(
            np.asarray(prompt), 0, model.make_kv_cache(1, 64), 0, all_logits=True
        )
        np.testing.assert_allclose(logits.max(-1), case["per_position_max_logit"], atol=1e-3)
        assert logits.argmax(-1).tolist() == case["per_position_argmax"]
        top5 = logits[-1][case["last_logits_top5_ids"]]
        np.testing.assert_allclose(top5, case["last_logits_top5"], atol=1e-3)
