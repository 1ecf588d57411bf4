"""Speculative decoding's verify pass: the k + 1 positions of one sequence (its last token
and k drafted ones, one slot, consecutive positions) run as k + 1 rows of ONE decode pass,
beside other sequences' rows, and every row is bitwise what one-token decode computes at
that position (serving/speculation.py relies on it for exact output). Every architecture
and block type (llama, qwen2 biases, qwen3 q/k norms, gemma3 sandwich norms and sliding
windows), the numpy, compiled CPU (per-op and fused) and xp-on-numpy backends."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels import get_backend
from kernels.xp.backend import XpBackend
from tests.engine.models.test_batch_invariance import TINY
from tests.support import skip_or_fail
from tests.tiny_gguf import write_tiny_llama

KS = (1, 3, 7)


def _backend(name: str):
    if name == "xp":
        return XpBackend(np)
    try:
        return get_backend(name)
    except ValueError as exc:
        skip_or_fail(str(exc))


def _load(path, backend):
    gf = GGUFFile(path)
    return architecture_module(gf.architecture).load(gf, backend=_backend(backend))


def check_verify_rows(model, vocab: int, lengths: list[int], n_ctx: int) -> None:
    """Slot 0 verifies k + 1 rows while slots 1.. decode one row each; every row equals
    the same token decoded alone, one step at a time, and the KV written agrees."""
    rng = np.random.default_rng(11)
    kv = model.make_kv_cache(len(lengths), n_ctx)
    for slot, n in enumerate(lengths):
        model.forward(rng.integers(0, vocab, size=n), 0, kv, slot)
    saved = kv.k.copy(), kv.v.copy()
    for k in KS:
        base = lengths[0]
        run = [int(t) for t in rng.integers(0, vocab, size=k + 1)]
        others = [int(t) for t in rng.integers(0, vocab, size=len(lengths) - 1)]
        kv.k[...], kv.v[...] = saved
        alone = [
            model.forward_decode([t], [base + j], [0], kv)[0].copy() for j, t in enumerate(run)
        ]
        expected_kv = kv.k[:, 0, :, : base + k + 1].copy()
        singles = [
            model.forward_decode([t], [lengths[s + 1]], [s + 1], kv)[0].copy()
            for s, t in enumerate(others)
        ]
        kv.k[...], kv.v[...] = saved
        # The other sequences' rows first and last, the verify rows in between.
        tokens = [others[0], *run, *others[1:]]
        positions = [lengths[1], *(base + j for j in range(k + 1)), *lengths[2:]]
        slots = [1, *([0] * (k + 1)), *range(2, len(lengths))]
        logits = np.asarray(
            model.backend.to_host(model.forward_decode(tokens, positions, slots, kv))
        )
        for j in range(k + 1):
            assert np.array_equal(logits[1 + j], alone[j]), (k, j)
        assert np.array_equal(logits[0], singles[0])
        for s in range(1, len(others)):
            assert np.array_equal(logits[k + 1 + s], singles[s]), (k, s)
        assert np.array_equal(kv.k[:, 0, :, : base + k + 1], expected_kv)


MODELS = ["tiny-llama", "tiny-qwen2.gguf", "tiny-qwen3.gguf"]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("spec") / "tiny-llama.gguf", seed=5)


def _tiny_path(name, tiny_llama):
    return tiny_llama if name == "tiny-llama" else TINY / name


@pytest.mark.parametrize("backend", ["numpy", "cpu", "xp"])
@pytest.mark.parametrize("name", MODELS)
def test_verify_rows_are_decode_rows_bitwise(name, backend, tiny_llama):
    model = _load(_tiny_path(name, tiny_llama), backend)
    vocab = min(model.hp.vocab_size, 256)
    for lengths in ([4, 9, 2], [30, 1, 17, 5]):
        check_verify_rows(model, vocab, lengths, n_ctx=48)


@pytest.mark.parametrize("fused", [True, False])
def test_verify_rows_on_the_cpu_backend_fused_and_per_op(fused, tiny_llama):
    model = _load(TINY / "tiny-qwen3.gguf", "cpu")
    if not fused:
        model.decode_stack = None
    else:
        assert model.decode_stack is not None
    check_verify_rows(model, 256, [12, 3, 7], n_ctx=40)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_gemma3_verify_rows_across_its_sliding_window(backend, gemma3_path):
    # sandwich norms, q/k norms, GELU; slot 0 verifies across the 512-token window edge
    model = _load(gemma3_path, backend)
    assert any(layer.window for layer in model.layers)
    window = model.hp.sliding_window
    check_verify_rows(model, 256, [window - 3, 6], n_ctx=window + 16)


def test_smollm2_verify_rows_on_the_cpu_backend(smollm2_path):
    model = _load(smollm2_path, "cpu")
    check_verify_rows(model, 256, [40, 7], n_ctx=64)


def test_the_cuda_attention_twin_writes_every_row_before_any_attends():
    # kernels/cuda/attention.cu (kv_write, then attention_chunk / combine), emulated on
    # the host: one slot's consecutive rows in one call, bitwise as one row at a time.
    from kernels.cuda import twins

    rng = np.random.default_rng(5)
    H, Hkv, Dh, n_ctx, base, k = 4, 2, 16, 300, 250, 7
    cache = rng.standard_normal((2, 2, 1, Hkv, n_ctx, Dh), dtype=np.float32)  # k, v
    q = rng.standard_normal((k + 1, H, Dh), dtype=np.float32)
    kk = rng.standard_normal((k + 1, Hkv, Dh), dtype=np.float32)
    vv = rng.standard_normal((k + 1, Hkv, Dh), dtype=np.float32)
    positions = np.arange(base, base + k + 1)
    for window in (0, 64):
        one_k, one_v = cache[0].copy(), cache[1].copy()
        alone = [
            twins.attention_decode(
                q[j : j + 1], kk[j : j + 1], vv[j : j + 1], one_k, one_v, 1, [0], [p], 0.25, window
            )[0]
            for j, p in enumerate(positions)
        ]
        all_k, all_v = cache[0].copy(), cache[1].copy()
        rows = twins.attention_decode(
            q, kk, vv, all_k, all_v, 1, [0] * (k + 1), positions, 0.25, window
        )
        for j in range(k + 1):
            assert np.array_equal(rows[j], alone[j]), (window, j)
        assert np.array_equal(all_k, one_k) and np.array_equal(all_v, one_v)
