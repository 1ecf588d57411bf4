"""The kernel seam: a second backend runs the shipped model without touching a model file,
and the reference backend's block-storage path equals the dequantisation oracle."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

import kernels
from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.backend import BLOCKS
from kernels.reference.backend import NumpyBackend
from tests.tiny_gguf import random_blocks

TOP5_ATOL = 1e-2
MARGIN_FLOOR = 0.01


class Float64Backend(NumpyBackend):
    """A test-only backend: every activation, weight and KV entry in float64."""

    name = "float64-test"
    dtype = np.dtype(np.float64)


class BlocksBackend(NumpyBackend):
    """The numpy reference, told to keep matrices in their GGUF blocks."""

    name = "blocks-test"

    def storage_for(self, qtype):
        return BLOCKS


@pytest.fixture
def float64_backend(monkeypatch):
    # Registered like any backend: models never name one, so no model file changes.
    monkeypatch.setitem(kernels.BACKENDS, Float64Backend.name, Float64Backend)
    kernels.get_backend.cache_clear()
    yield kernels.get_backend(Float64Backend.name)
    kernels.get_backend.cache_clear()


def test_a_float64_backend_runs_smollm2_through_the_same_block(
    float64_backend, smollm2_path, smollm2_f32
):
    gf = GGUFFile(smollm2_path)
    model = architecture_module(gf.architecture).load(gf, backend=float64_backend)
    assert model.backend is float64_backend
    assert model.tok_embd.data.dtype == np.float64
    case = smollm2_f32["greedy"][0]
    as_list = (lambda v: v) if isinstance(case["greedy_ids"], list) else __import__("json").loads
    prompt, expected = as_list(case["prompt_ids"]), as_list(case["greedy_ids"])[:16]
    margins = as_list(case["top1_top2_margin"])
    kv = model.make_kv_cache(2, len(prompt) + len(expected) + 1)
    assert kv.k.dtype == np.float64
    logits = model.forward(np.asarray(prompt), 0, kv, 0)
    got = []
    for step, ref in enumerate(as_list(case["steps"])[: len(expected)]):
        np.testing.assert_allclose(logits[ref["top_ids"]], ref["top_logits"], atol=TOP5_ATOL)
        got.append(int(np.argmax(logits)))
        # Decode through the batched pass, beside a second row on slot 1.
        logits = model.forward_decode([got[-1], 1], [len(prompt) + step, 0], [0, 1], kv)[0]
    tie = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(expected))
    assert got[:tie] == expected[:tie]


BLOCK_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_block_storage_linear_equals_the_dequantised_oracle(qtype, rows):
    be = NumpyBackend()
    cols = 512  # a multiple of every block size (32 and 256)
    blocks = random_blocks(f"w{rows}", (rows, cols), qtype)
    oracle = dequantize(blocks, qtype).astype(np.float32).reshape(rows, cols)
    w = be.block_weight(blocks.reshape(rows, -1), qtype, (rows, cols))
    assert w.storage == qtype.name and w.is_blocks
    x = np.random.default_rng(0).standard_normal((5, cols), dtype=np.float32)
    dense = be.dense_weight(oracle)
    assert np.array_equal(be.linear(x, w), be.linear(x, dense))  # same bits as dense rows
    np.testing.assert_allclose(be.linear_prefill(x, w), x @ oracle.T, rtol=1e-5, atol=1e-4)
    ids = np.array([0, rows - 1, rows // 2])
    assert np.array_equal(be.embed(w, ids), oracle[ids])


def test_a_model_kept_in_blocks_computes_what_the_dense_one_does(tmp_path, monkeypatch):
    from tests.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(
        tmp_path / "q.gguf", matrix_type=Q.Q4_K, raw_blocks=True, d_model=256, n_head=4,
        n_kv_head=2, d_ff=512, n_layer=1,
    )  # fmt: skip
    gf = GGUFFile(path)
    dense = architecture_module("llama").load(gf, backend=NumpyBackend())
    blocks = architecture_module("llama").load(gf, backend=BlocksBackend())
    assert blocks.layers[0].attn_qkv.storage == "Q4_K"
    assert blocks.weight_bytes < dense.weight_bytes / 4  # the file's bytes, not float32
    tokens = np.array([1, 40, 41, 42, 2, 43])
    a = dense.forward(tokens, 0, dense.make_kv_cache(2, 16), 0, all_logits=True)
    b = blocks.forward(tokens, 0, blocks.make_kv_cache(2, 16), 0, all_logits=True)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    kv_a, kv_b = dense.make_kv_cache(2, 16), blocks.make_kv_cache(2, 16)
    dense.forward(tokens, 0, kv_a, 0)
    blocks.forward(tokens, 0, kv_b, 0)
    np.testing.assert_array_equal(
        dense.forward_decode([7], [6], [0], kv_a), blocks.forward_decode([7], [6], [0], kv_b)
    )


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        kernels.get_backend("nope")
