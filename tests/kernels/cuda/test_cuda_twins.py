"""The numpy twins of the CUDA kernels (kernels/cuda/twins.py, issue 16) against the numpy
reference: the mat-vec over every block type against dequantise-then-multiply, RMSNorm,
RoPE, the GLU activations, soft-capping, and flash-decode attention (GQA, sliding window,
soft-cap, positions on and around chunk boundaries) against NumpyBackend's; the
mat-vec and attention rows bitwise as alone for B = 1..8; and CudaBackend's code around
its kernels run on the twins (the tiny models as XpBackend computes them, batch invariant). The kernels themselves run
against these twins on a GPU (tests/gpu/test_cuda_kernels.py)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.cuda import backend as cuda_backend
from kernels.cuda import kernels as cuda_kernels
from kernels.cuda import twins as cuda_twins
from kernels.cuda.backend import CudaBackend
from kernels.reference import backend as numpy_backend
from kernels.xp import quants as xp_quants
from kernels.xp.backend import XpBackend, XpKVCache
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance
from tests.tiny_gguf import random_blocks

TYPES = list(cuda_kernels.QTYPES)
CHUNK = cuda_kernels.define("ATT_CHUNK")


def blocks_of(qtype: Q, rows: int, k: int, name: str = "") -> np.ndarray:
    """Random blocks of qtype (F32: random finite values, as bytes)."""
    if qtype == Q.F32:
        values = np.random.default_rng(rows + k).standard_normal((rows, k)).astype(np.float32)
        return values.view(np.uint8).reshape(rows, -1)
    return random_blocks(f"twin-{name}{qtype.name}", (rows, k), qtype)


def widths(qtype: Q) -> list[int]:
    """Row widths: whole warps of 256 values and, for the 32-value types, a tail of idle lanes."""
    return [512] if qtype in cuda_kernels.K_QUANTS else [96, 544]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_matvec_twin_is_the_dequantised_product(qtype):
    rng = np.random.default_rng(1)
    for k in widths(qtype):
        blocks = blocks_of(qtype, 37, k)
        x = rng.standard_normal((5, k)).astype(np.float32)
        ours = cuda_twins.matvec(x, blocks, qtype)
        ref = x.astype(np.float64) @ xp_quants.dequantize(np, blocks, qtype).T.astype(np.float64)
        assert ours.dtype == np.float32 and ours.shape == (5, 37)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_matvec_twin_rows_are_bitwise_as_alone(qtype):
    k = widths(qtype)[-1]
    blocks = blocks_of(qtype, 19, k, "alone-")
    x = np.random.default_rng(2).standard_normal((8, k)).astype(np.float32)
    alone = [cuda_twins.matvec(x[b : b + 1], blocks, qtype)[0] for b in range(8)]
    for B in range(1, 9):
        batched = cuda_twins.matvec(x[:B], blocks, qtype)
        for b in range(B):
            assert np.array_equal(batched[b], alone[b]), (B, b)


@pytest.mark.parametrize("shape", [(5, 576), (3, 4, 64), (2, 1000), (1, 256)])
def test_the_rms_norm_twin_is_the_references(shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    ours = cuda_twins.rms_norm(x, w, 1e-6)
    assert ours.shape == x.shape
    np.testing.assert_allclose(ours, numpy_backend.rms_norm(x, w, 1e-6), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_the_rope_twin_is_bitwise_the_references(neox):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 4, 64)).astype(np.float32)
    cos, sin = numpy_backend.rope_tables(300, 64, 10000.0)
    positions = np.array([0, 1, 17, 255, 256, 299])
    ref_fn = numpy_backend.apply_rope_neox if neox else numpy_backend.apply_rope_interleaved
    ref = ref_fn(x, cos[positions], sin[positions])
    assert np.array_equal(cuda_twins.rope(x, positions, cos, sin, neox), ref)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_the_glu_twin_is_the_references(activation):
    rng = np.random.default_rng(5)
    gate_up = (rng.standard_normal((4, 2 * 96)) * 4).astype(np.float32)
    gate_up[0, :3] = [-100.0, -88.5, 90.0]  # silu's exp overflow: the limit, -0
    ref = numpy_backend.ACTIVATIONS[activation](gate_up[:, :96]) * gate_up[:, 96:]
    ours = cuda_twins.glu(gate_up, 96, activation)
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-6)


def test_the_softcap_twin_is_the_references():
    x = (np.random.default_rng(6).standard_normal((3, 50)) * 40).astype(np.float32)
    ref = numpy_backend.softcap_values(x, 30.0)
    np.testing.assert_allclose(cuda_twins.softcap(x, 30.0), ref, rtol=1e-6, atol=1e-6)


# ---- attention ----

H, HKV, DH, N_CTX, N_SLOTS = 8, 2, 64, 1100, 8
# Positions on both sides of the chunk boundaries, the first and a long one.
POSITIONS = [0, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 700, N_CTX - 1]


def kv_with_history(seed: int) -> XpKVCache:
    """A float32 cache (2 layers) with random keys and values in every slot."""
    kv = XpKVCache(np, 2, N_SLOTS, HKV, N_CTX, DH)
    rng = np.random.default_rng(seed)
    kv.k[...] = rng.standard_normal(kv.k.shape, dtype=np.float32)
    kv.v[...] = rng.standard_normal(kv.v.shape, dtype=np.float32)
    return kv


def decode_inputs(B: int):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((B, H, DH), dtype=np.float32)
    k = rng.standard_normal((B, HKV, DH), dtype=np.float32)
    v = rng.standard_normal((B, HKV, DH), dtype=np.float32)
    return q, k, v


@pytest.mark.parametrize(
    "window, softcap", [(0, 0.0), (300, 0.0), (256, 0.0), (0, 20.0), (100, 50.0)]
)
def test_the_attention_twin_is_the_references(window, softcap):
    B = len(POSITIONS)
    q, k, v = decode_inputs(B)
    slots = [3, 0, 7, 1, 2, 5, 4, 6]
    scale = DH**-0.5
    ours_kv, ref_kv = kv_with_history(8), kv_with_history(8)
    ours = cuda_twins.attention_decode(
        q, k, v, ours_kv.k, ours_kv.v, 1, slots, POSITIONS, scale, window, softcap
    )
    ref = numpy_backend.NumpyBackend().attention_decode(
        q, k, v, ref_kv, 1, slots, np.array(POSITIONS), scale, window, softcap
    )
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=2e-6)
    assert np.array_equal(ours_kv.k, ref_kv.k) and np.array_equal(ours_kv.v, ref_kv.v)


def test_attention_twin_rows_are_bitwise_as_alone():
    q, k, v = decode_inputs(8)
    slots, scale = [6, 1, 4, 0, 7, 2, 5, 3], 0.125

    def run(rows):
        kv = kv_with_history(9)
        positions = [POSITIONS[b] for b in rows]
        return cuda_twins.attention_decode(
            q[rows],
            k[rows],
            v[rows],
            kv.k,
            kv.v,
            0,
            [slots[b] for b in rows],
            positions,
            scale,
            300,
            30.0,
        )

    alone = [run([b])[0] for b in range(8)]
    for B in range(1, 9):
        batched = run(list(range(B)))
        for b in range(B):
            assert np.array_equal(batched[b], alone[b]), (B, b)
    mixed = run([5, 2, 7, 0])
    for j, b in enumerate([5, 2, 7, 0]):
        assert np.array_equal(mixed[j], alone[b]), b


# ---- CudaBackend's own code on the twins ----


class TwinLaunchers:
    """kernels.cuda.kernels' launchers computed by the twins, on numpy: CudaBackend's code
    around the kernels (stacked parts into their columns, prefill chunks, embeddings, the
    cache) runs here as it will on a device."""

    supports = staticmethod(cuda_kernels.supports)
    define = staticmethod(cuda_kernels.define)
    rms_norm = staticmethod(cuda_twins.rms_norm)
    rope = staticmethod(cuda_twins.rope)
    glu = staticmethod(cuda_twins.glu)
    softcap = staticmethod(cuda_twins.softcap)
    attention_decode = staticmethod(cuda_twins.attention_decode)

    @staticmethod
    def matvec(x, blocks, qtype, n, k, out):
        out[...] = cuda_twins.matvec(x, blocks.view(np.uint8).reshape(n, -1), qtype)
        return out

    @staticmethod
    def dequantize(blocks, qtype, n, k):
        return cuda_twins.dequantize(blocks, qtype)


@pytest.fixture
def backend_on_twins(monkeypatch):
    monkeypatch.setattr(cuda_backend, "cuda_kernels", TwinLaunchers())
    backend = CudaBackend.__new__(CudaBackend)  # no CuPy here: XpBackend's numpy state
    XpBackend.__init__(backend, np)
    backend.die, backend._device = 0, contextlib.nullcontext()
    return backend


def load(name: str, backend):
    gf = GGUFFile(TINY / name)
    return architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.mark.parametrize("name", ["tiny-qwen2.gguf", "tiny-qwen3.gguf"])
def test_the_cuda_backend_on_the_twins_computes_what_xp_computes(backend_on_twins, name):
    ours, ref = load(name, backend_on_twins), load(name, XpBackend(np))
    prompt = np.random.default_rng(10).integers(0, 256, size=23)
    logits = []
    for model in (ours, ref):
        kv = model.make_kv_cache(2, 64)
        logits.append(model.forward(prompt, 0, kv, 0, all_logits=True))
        logits.append(model.forward_decode([5, 9], [23, 0], [0, 1], kv))
    np.testing.assert_allclose(logits[0], logits[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[1], logits[3], rtol=1e-5, atol=1e-5)
    check_batch_invariance(ours, 256, [3, 5, 9, 2, 12, 7, 4, 6])
