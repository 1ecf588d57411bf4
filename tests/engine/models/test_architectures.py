"""gemma3, qwen2 and qwen3 against independent float32 references (tests/reference)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module, supported_architectures
from engine.text.tokenizer import Tokenizer

MARGIN_FLOOR = 0.01


def as_list(value):
    return json.loads(value) if isinstance(value, str) else value


def load_model(path):
    gf = GGUFFile(path)
    return gf, architecture_module(gf.architecture).load(gf)


def greedy(model, prompt_ids, n_steps):
    kv = model.make_kv_cache(1, len(prompt_ids) + n_steps + 1)
    logits = model.forward(np.asarray(prompt_ids), 0, kv, 0)
    out, seen = [], []
    for pos in range(len(prompt_ids), len(prompt_ids) + n_steps):
        seen.append(logits)
        out.append(int(np.argmax(logits)))
        logits = model.forward(np.asarray(out[-1:]), pos, kv, 0)
    return out, seen


def test_the_supported_architectures_are_listed():
    assert {"llama", "qwen2", "qwen3", "gemma3"} <= set(supported_architectures())


@pytest.mark.parametrize("name", ["tiny-qwen2.gguf", "tiny-qwen3.gguf"])
def test_tiny_qwen_models_match_the_reference_logits(name, reference_dir, tiny_f32):
    ref = next(m for m in tiny_f32["models"] if m["gguf"] == name)
    path = reference_dir / "tiny" / name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["sha256"]
    gf, model = load_model(path)
    assert gf.architecture == name.split("-")[1].removesuffix(".gguf")
    check_tiny_reference(model, ref)


def check_tiny_reference(model, ref: dict) -> None:
    """Every case of a tiny model's reference: per-position max logit and argmax over the
    prompt, the last position's top-5, greedy ids up to the reference's first near tie."""
    for case in ref["cases"]:
        prompt = case["prompt_ids"]
        logits = model.forward(
            np.asarray(prompt), 0, model.make_kv_cache(1, 128), 0, all_logits=True
        )
        np.testing.assert_allclose(logits.max(-1), case["per_position_max_logit"], atol=1e-2)
        assert logits.argmax(-1).tolist() == case["per_position_argmax"]
        np.testing.assert_allclose(
            logits[-1][case["last_logits_top5_ids"]], case["last_logits_top5"], atol=1e-2
        )
        expected, margins = case["greedy_ids"], case["top1_top2_margin"]
        got, _ = greedy(model, prompt, len(expected))
        tie = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(expected))
        assert got[:tie] == expected[:tie]


def test_gemma3_is_the_reference_file(gemma3_path, gemma3_f32):
    assert hashlib.sha256(gemma3_path.read_bytes()).hexdigest() == gemma3_f32["sha256"]


@pytest.fixture(scope="module")
def gemma3(gemma3_path):
    return load_model(gemma3_path)


def test_gemma3_tokenizer_reproduces_every_reference_string(gemma3, gemma3_f32):
    tok = Tokenizer.from_gguf(gemma3[0].reader)
    for entry in gemma3_f32["tokenize"]:
        assert tok.encode(entry["text"]) == entry["ids"], entry["text"]
        assert tok.decode(entry["ids"]) == entry["text"]
    case = gemma3_f32["greedy"][0]
    assert tok.encode(case["text"], add_special=True) == as_list(case["prompt_ids"])  # with BOS


def test_gemma3_greedy_decode_equals_the_float32_reference(gemma3, gemma3_f32):
    _, model = gemma3
    for case in gemma3_f32["greedy"]:
        expected, margins = as_list(case["greedy_ids"]), as_list(case["top1_top2_margin"])
        got, seen = greedy(model, as_list(case["prompt_ids"]), len(expected))
        tie = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(expected))
        assert got[:tie] == expected[:tie], case["text"]
        for step, ref in enumerate(as_list(case["steps"])):
            np.testing.assert_allclose(seen[step][ref["top_ids"]], ref["top_logits"], atol=1e-2)


def test_sliding_window_attention_hides_keys_beyond_the_window():
    """A sliding-window layer's output for the last token must not change when a token
    further back than the window changes; a global layer's must."""
    from kernels.reference.backend import attend

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    keys = rng.standard_normal((1, 20, 8)).astype(np.float32)
    values = rng.standard_normal((1, 20, 8)).astype(np.float32)
    changed = keys.copy()
    changed[:, 0] += 5.0
    local = [attend(q, k, values, 19, 0.3, window=8) for k in (keys, changed)]
    full = [attend(q, k, values, 19, 0.3) for k in (keys, changed)]
    np.testing.assert_array_equal(local[0], local[1])
    assert not np.allclose(full[0], full[1])


def test_the_decode_attention_sees_the_same_window_as_the_prefill():
    """The batched decode path slices the window where prefill masks it: same result."""
    from kernels.reference.backend import NumpyBackend, attend

    be = NumpyBackend()
    rng = np.random.default_rng(1)
    kv = be.make_kv_cache(1, 1, 1, 32, 8)
    k = rng.standard_normal((20, 1, 8)).astype(np.float32)
    v = rng.standard_normal((20, 1, 8)).astype(np.float32)
    q = rng.standard_normal((20, 4, 8)).astype(np.float32)
    be.attention_prefill(q[:19], k[:19], v[:19], kv, 0, 0, 0, 0.3, window=8)
    one = be.attention_decode(q[19:], k[19:], v[19:], kv, 0, [0], np.array([19]), 0.3, window=8)
    keys, values = kv.view(0, 0, 20)
    np.testing.assert_allclose(one, attend(q[19:], keys, values, 19, 0.3, window=8), atol=1e-6)
