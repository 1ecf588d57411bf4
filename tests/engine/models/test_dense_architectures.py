"""granite, olmo2, phi3, gemma2 and smollm3 against float32 transformers references.

The tiny GGUFs and tiny_dense_f32.json are written by scripts/reference_dense.py (random
weights, each architecture's real tensor names and metadata keys, SmolLM2's vocabulary);
the reference logits come from that architecture's transformers model loaded with the
GGUF's dequantised weights. Checked on the compiled CPU backend (the default), the
numpy reference backend and the GPU backend's logic with xp = numpy: per-position max logit and argmax, the last position's top-5
within 1e-2, greedy ids up to the first step whose reference margin is under 0.05;
then each decodes a batch bitwise as alone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module, supported_architectures
from engine.types import UnsupportedArchitecture
from kernels.reference.backend import NumpyBackend, rope_tables
from kernels.xp.backend import XpBackend
from tests.engine.models.test_architectures import greedy
from tests.engine.models.test_batch_invariance import check_batch_invariance
from tests.engine.models.test_fused_decode import _check as check_fused_step
from tests.engine.models.test_pipeline import (
    test_a_split_model_computes_the_bits_of_the_whole_one as split_matches_whole,
)

TINY = Path(__file__).resolve().parents[2] / "reference" / "tiny"
ARCHS = ["granite", "olmo2", "phi3", "gemma2", "smollm3"]
MARGIN = 0.05


@pytest.fixture(scope="module")
def references() -> dict:
    data = json.loads((TINY / "tiny_dense_f32.json").read_text("utf-8"))
    return {m["gguf"]: m for m in data["models"]}


def load(arch: str, backend=None):
    gf = GGUFFile(TINY / f"tiny-{arch}.gguf")
    assert gf.architecture == arch
    return architecture_module(arch).load(gf, backend=backend)


def test_the_dense_architectures_are_supported():
    assert set(ARCHS) <= set(supported_architectures())


def test_an_unknown_architecture_names_itself_and_the_supported_list():
    with pytest.raises(UnsupportedArchitecture) as err:
        architecture_module("mamba9")
    assert "'mamba9'" in str(err.value)
    for arch in ARCHS:
        assert arch in str(err.value)


BACKENDS = {"cpu": lambda: None, "numpy": NumpyBackend, "xp": lambda: XpBackend(np)}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_matches_the_transformers_reference(arch, backend, references):
    ref = references[f"tiny-{arch}.gguf"]
    path = TINY / ref["gguf"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["sha256"]
    model = load(arch, BACKENDS[backend]())
    if backend == "cpu" and model.backend.name == "numpy":
        pytest.skip("the compiled CPU kernels are not built")
    for case in ref["cases"]:
        prompt = case["prompt_ids"]
        kv = model.make_kv_cache(1, 128)
        logits = model.forward(np.asarray(prompt), 0, kv, 0, all_logits=True)
        np.testing.assert_allclose(logits.max(-1), case["per_position_max_logit"], atol=1e-2)
        assert logits.argmax(-1).tolist() == case["per_position_argmax"]
        np.testing.assert_allclose(
            logits[-1][case["last_logits_top5_ids"]], case["last_logits_top5"], atol=1e-2
        )
        expected, margins = case["greedy_ids"], case["top1_top2_margin"]
        got, _ = greedy(model, prompt, len(expected))
        tie = next((i for i, m in enumerate(margins) if m < MARGIN), len(expected))
        assert got[:tie] == expected[:tie]


@pytest.mark.parametrize("backend", ["cpu", "xp"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_dense_architecture_decodes_a_batch_bitwise_as_alone(arch, backend):
    model = load(arch, BACKENDS[backend]())
    # gemma2's window is 8: these lengths put most slots past it.
    check_batch_invariance(model, 256, [3, 5, 9, 2, 12, 7, 4, 14])


def test_the_declarations_reach_the_block():
    """What each file sets is read into its model: the multipliers, the caps, the
    window pattern, the layers without RoPE, the fused tensors."""
    granite = load("granite")
    spec = granite.spec
    assert (spec.embedding_multiplier, spec.residual_multiplier) == pytest.approx((2.0, 0.8))
    assert (granite.attn_scale, spec.logit_divisor) == pytest.approx((0.2, 2.0))
    gemma2 = load("gemma2")
    assert (gemma2.spec.attn_softcap, gemma2.spec.final_softcap) == (5.0, 60.0)
    assert [layer.window for layer in gemma2.layers] == [8, 0]
    smollm3 = load("smollm3")
    assert [layer.rope is None for layer in smollm3.layers] == [False, False, False, True]
    phi3 = load("phi3", NumpyBackend())  # fused in the file: one matrix each, as stored
    hp = phi3.hp
    assert phi3.layers[0].attn_qkv.shape == ((hp.n_head + 2 * hp.n_kv_head) * hp.head_dim, 64)
    assert phi3.layers[0].ffn_gate_up.shape == (2 * hp.d_ff, 64)
    olmo2 = load("olmo2")
    assert all(layer.attn_norm is None and layer.ffn_norm is None for layer in olmo2.layers)
    assert olmo2.layers[0].attn_q_norm.shape == (olmo2.hp.n_head * olmo2.hp.head_dim,)


def test_phi3_picks_its_longrope_factors_by_the_served_context():
    """Short factors within the original context (4096 here), long ones past it, with
    cos/sin scaled by the file's attn_factor either way (the reference covers the short
    ones: transformers switches to the long ones only past 4096 positions). The choice
    is each KV cache's own."""
    model = load("phi3", NumpyBackend())
    spec, hp = model.spec, model.hp
    assert spec.rope_orig_ctx == 4096 and len(spec.rope_factors_long) == hp.rope_dim // 2
    assert (hp.rope_dim, hp.head_dim) == (12, 16)  # partial RoPE, as Phi-4-mini's
    tables = {"short": model.layers[0].rope, "long": model.long_rope}
    for kind, factors in (("short", spec.rope_factors_short), ("long", spec.rope_factors_long)):
        cos, _ = rope_tables(
            hp.n_ctx_train, hp.rope_dim, hp.rope_base, factors, spec.rope_attn_factor
        )
        np.testing.assert_array_equal(tables[kind].cos, cos)
    # The same prompt on a cache within 4096 positions and on one past it: only the
    # rotation differs, so the logits do; a scratch cache changes nothing for the others.
    prompt = np.arange(100, 120)
    short = model.forward(prompt, 0, model.make_kv_cache(1, 128), 0)
    long_kv = model.make_kv_cache(1, 8192)
    model.make_kv_cache(1, 64)
    long = model.forward(prompt, 0, long_kv, 0)
    assert not np.allclose(short, long, atol=1e-3)
    np.testing.assert_array_equal(short, model.forward(prompt, 0, model.make_kv_cache(1, 64), 0))


def test_gemma2_fused_decode_step_is_the_per_op_step_bitwise():
    """The compiled one-call decode stack takes gemma2 (attention soft-cap, windows of 8
    positions, sandwich norms) and gives the per-op bits; the options it does not do
    leave the others on the per-op path."""
    model = load("gemma2")
    if model.backend.name == "numpy":
        pytest.skip("the compiled CPU kernels are not built")
    check_fused_step(model)
    for arch in ("granite", "olmo2", "phi3", "smollm3"):
        assert load(arch).decode_stack is None, arch


@pytest.mark.parametrize("arch", ARCHS)
def test_a_split_dense_model_computes_the_bits_of_the_whole_one(arch):
    """Split by layers across two host dies (models/_pipeline.py): each stage reads the
    file's options into its own spec and gives the whole model's bits."""
    split_matches_whole(f"tiny-{arch}.gguf")
