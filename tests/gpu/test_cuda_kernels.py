"""The CUDA C kernels (kernels/cuda/, issue 16) on a device against their numpy twins
(kernels/cuda/twins.py): bitwise where the twin repeats the kernel's float32 operations
(dequantise, mat-vec, RMSNorm, RoPE: compiled with --fmad=false), within a few ulp where the
kernel calls expf / tanhf (GLU, soft-cap, attention); the mat-vec and attention rows bitwise
as alone for B = 1..8; and CudaBackend on the tiny qwen2 / qwen3 models against XpBackend
on numpy, decode rows bitwise as alone.

Run on an H200 (tests/gpu/run-on-device.sh); on the CPU the kernels only compile
(tests/kernels/cuda/test_cuda_sources.py). NVRTC compiles each program once per session (the
launchers cache the modules), a few seconds in all."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.cuda import kernels as cuda_kernels
from kernels.cuda import twins as cuda_twins
from kernels.reference import backend as numpy_backend
from kernels.xp.backend import XpBackend
from tests import cuda_checks
from tests.cuda_checks import same_bits, width
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance

TYPES = list(cuda_kernels.QTYPES)
CHUNK = cuda_kernels.define("ATT_CHUNK")


def blocks_of(qtype: Q, rows: int, k: int) -> np.ndarray:
    return cuda_checks.blocks_of("gpu-kernel", qtype, rows, k)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantisation_is_bitwise_xp_quants(cp, qtype):
    blocks = blocks_of(qtype, 13, width(qtype))
    ours = cuda_kernels.dequantize(cp.asarray(blocks), qtype, 13, width(qtype))
    assert same_bits(cp.asnumpy(ours), cuda_twins.dequantize(blocks, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_matvec_is_its_twin_bitwise_and_each_row_as_alone(cp, qtype):
    n, k = 67, width(qtype)  # 67 rows: a last block of MATVEC_ROWS not full
    blocks = blocks_of(qtype, n, k)
    x = np.random.default_rng(1).standard_normal((11, k)).astype(np.float32)
    W, X = cp.asarray(blocks), cp.asarray(x)
    ours = cp.asnumpy(cuda_kernels.matvec(X, W, qtype, n, k))  # 11 rows: two x tiles
    assert same_bits(ours, cuda_twins.matvec(x, blocks, qtype))
    alone = [cp.asnumpy(cuda_kernels.matvec(X[b : b + 1], W, qtype, n, k))[0] for b in range(8)]
    for B in range(1, 9):
        batched = cp.asnumpy(cuda_kernels.matvec(X[:B], W, qtype, n, k))
        for b in range(B):
            assert same_bits(batched[b], alone[b]), (B, b)


def test_the_matvec_writes_a_stacked_part_into_its_columns(cp):
    blocks = blocks_of(Q.Q4_K, 40, 512)
    x = np.random.default_rng(2).standard_normal((3, 512)).astype(np.float32)
    out = cp.full((3, 100), 7.0, dtype=np.float32)
    cuda_kernels.matvec(cp.asarray(x), cp.asarray(blocks), Q.Q4_K, 40, 512, out=out[:, 30:70])
    got = cp.asnumpy(out)
    assert same_bits(got[:, 30:70], cuda_twins.matvec(x, blocks, Q.Q4_K))
    assert (got[:, :30] == 7).all() and (got[:, 70:] == 7).all()


@pytest.mark.parametrize("shape", [(5, 576), (3, 4, 64), (2, 1000)])
def test_rms_norm_is_its_twin_bitwise(cp, shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    ours = cuda_kernels.rms_norm(cp.asarray(x), cp.asarray(w), 1e-6)
    assert same_bits(cp.asnumpy(ours), cuda_twins.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_rope_is_its_twin_bitwise(cp, neox):
    x = np.random.default_rng(4).standard_normal((6, 4, 64)).astype(np.float32)
    cos, sin = numpy_backend.rope_tables(300, 64, 10000.0)
    positions = np.array([0, 1, 17, 255, 256, 299])
    ours = cuda_kernels.rope(cp.asarray(x), positions, cp.asarray(cos), cp.asarray(sin), neox)
    assert same_bits(cp.asnumpy(ours), cuda_twins.rope(x, positions, cos, sin, neox))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_glu_is_its_twin(cp, activation):
    gate_up = (np.random.default_rng(5).standard_normal((4, 192)) * 4).astype(np.float32)
    gate_up[0, :3] = [-100.0, -88.5, 90.0]
    ours = cp.asnumpy(cuda_kernels.glu(cp.asarray(gate_up), 96, activation))
    # atol 1e-5: where 1 + tanh cancels (gate near -6), a libm's tanhf one ulp off moves
    # the product by ~1e-6 (glibc's against numpy's, seen in the emulated test).
    twin = cuda_twins.glu(gate_up, 96, activation)
    np.testing.assert_allclose(ours, twin, rtol=4e-6, atol=1e-5)


def test_softcap_is_its_twin(cp):
    x = (np.random.default_rng(6).standard_normal((3, 50)) * 40).astype(np.float32)
    ours = cp.asnumpy(cuda_kernels.softcap(cp.asarray(x), 30.0))
    np.testing.assert_allclose(ours, cuda_twins.softcap(x, 30.0), rtol=4e-6, atol=1e-6)


# ---- attention ----

H, HKV, N_CTX, N_SLOTS = 8, 2, 1100, 8
POSITIONS = [0, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 700, N_CTX - 1]
SLOTS = [3, 0, 7, 1, 2, 5, 4, 6]


def caches(dh: int):
    rng = np.random.default_rng(8)
    shape = (2, N_SLOTS, HKV, N_CTX, dh)
    return rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(
        shape, dtype=np.float32
    )


def decode_inputs(dh: int):
    rng = np.random.default_rng(7)
    B = len(POSITIONS)
    return [rng.standard_normal((B, h, dh), dtype=np.float32) for h in (H, HKV, HKV)]


@pytest.mark.parametrize(
    "dh, window, softcap", [(64, 0, 0.0), (64, 300, 0.0), (128, 256, 0.0), (256, 100, 50.0)]
)
def test_attention_is_its_twin(cp, dh, window, softcap):
    q, k, v = decode_inputs(dh)
    ck, cv = caches(dh)
    dev_k, dev_v = cp.asarray(ck), cp.asarray(cv)
    args = (1, SLOTS, POSITIONS, dh**-0.5, window, softcap)
    ours = cuda_kernels.attention_decode(
        cp.asarray(q), cp.asarray(k), cp.asarray(v), dev_k, dev_v, *args
    )
    ref = cuda_twins.attention_decode(q, k, v, ck, cv, *args)
    np.testing.assert_allclose(cp.asnumpy(ours), ref, rtol=2e-5, atol=2e-6)
    assert same_bits(cp.asnumpy(dev_k), ck) and same_bits(cp.asnumpy(dev_v), cv)


def test_attention_rows_are_bitwise_as_alone(cp):
    q, k, v = (cp.asarray(a) for a in decode_inputs(64))
    history = caches(64)

    def run(rows):
        ck, cv = (cp.asarray(c) for c in history)
        where = ([SLOTS[b] for b in rows], [POSITIONS[b] for b in rows])
        out = cuda_kernels.attention_decode(
            q[rows], k[rows], v[rows], ck, cv, 0, *where, 0.125, 300, 30.0
        )
        return cp.asnumpy(out)

    alone = [run([b])[0] for b in range(8)]
    for B in range(1, 9):
        batched = run(list(range(B)))
        for b in range(B):
            assert same_bits(batched[b], alone[b]), (B, b)
    order = [5, 2, 7, 0]
    mixed = run(order)
    for j, b in enumerate(order):
        assert same_bits(mixed[j], alone[b]), b


# ---- the backend on the tiny models ----

TINY_MODELS = ["tiny-qwen2.gguf", "tiny-qwen3.gguf"]


def load(name, backend):
    gf = GGUFFile(TINY / name)
    return architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.fixture(scope="module")
def cuda_backend(cp):
    from kernels.cuda.backend import CudaBackend

    return CudaBackend(0)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_the_cuda_backend_computes_what_xp_computes_on_numpy(cp, cuda_backend, name):
    ours, ref = load(name, cuda_backend), load(name, XpBackend(np))
    prompt = np.random.default_rng(9).integers(0, 256, size=23)
    logits = []
    for model in (ours, ref):
        kv = model.make_kv_cache(2, 64)
        logits.append(model.forward(prompt, 0, kv, 0, all_logits=True))
        logits.append(model.forward_decode([5, 9], [23, 0], [0, 1], kv))
    assert all(isinstance(a, np.ndarray) for a in logits)  # only logits come back
    np.testing.assert_allclose(logits[0], logits[2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1], logits[3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_each_decode_row_of_the_cuda_backend_is_bitwise_as_alone(cp, cuda_backend, name):
    model = load(name, cuda_backend)
    assert isinstance(model.make_kv_cache(1, 4).k, cp.ndarray)
    check_batch_invariance(model, 256, [3, 5, 9, 2, 12, 7, 4, 6])
