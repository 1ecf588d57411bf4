"""The CUDA C kernels (kernels/cuda/, issue 16) run on the host by an emulator with CUDA's
execution semantics (tests/kernels/cuda/cuda_emu: every CUDA thread a fiber, real barriers
and warp shuffles, a fake `cupy` behind kernels.cuda.kernels' unchanged launchers). What
a GPU run will check (tests/gpu/test_cuda_kernels.py), checked here on the kernels' own
thread logic: each kernel through its launcher against its numpy twin (bitwise where the
twin repeats the kernel's float32 operations: -ffp-contract=off here, --fmad=false
there), rows bitwise as alone for B = 1..8, CudaBackend on the tiny models against
XpBackend on numpy, and the shipped SmolLM2 and gemma3 through the kernels giving their
float32 reference's first greedy tokens. Plus the emulator's own checks: a kernel breaking CUDA's rules fails.

An emulator, not a GPU: expf / tanhf are glibc's, the memory model and timing are not
modelled (tests/kernels/cuda/cuda_emu/emu.h)."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.cuda import kernels as cuda_kernels
from kernels.cuda import twins as cuda_twins
from kernels.devices import dies
from kernels.reference import backend as numpy_backend
from kernels.xp.backend import XpBackend
from tests import cuda_checks
from tests.cuda_checks import same_bits, width
from tests.engine.models.test_architectures import as_list
from tests.engine.models.test_batch_invariance import TINY
from tests.kernels.cuda import cuda_emu

TYPES = list(cuda_kernels.QTYPES)
CHUNK = cuda_kernels.define("ATT_CHUNK")


@pytest.fixture(scope="module")
def cp():
    """The fake cupy installed: the launchers compile and run the kernels on the emulator."""
    if cuda_emu.CXX is None:
        pytest.skip("g++ is not on PATH (the CUDA emulator compiles the kernels with it)")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the emulator switches its fibers with x86-64 code")
    dies.manager()  # probed now, before the fake cupy exists: it never becomes a die
    fake = cuda_emu.fake_cupy()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupy", fake)
        mp.setattr(cuda_kernels, "_modules", {})  # no module compiled by another cupy
        yield fake


def blocks_of(qtype: Q, rows: int, k: int) -> np.ndarray:
    return cuda_checks.blocks_of("emu-kernel", qtype, rows, k)


# ---- matrices ----


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantisation_is_bitwise_its_twin(cp, qtype):
    blocks = blocks_of(qtype, 13, width(qtype))
    ours = cuda_kernels.dequantize(cp.asarray(blocks), qtype, 13, width(qtype))
    assert same_bits(cp.asnumpy(ours), cuda_twins.dequantize(blocks, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_matvec_is_its_twin_bitwise_and_each_row_as_alone(cp, qtype):
    n, k = 67, width(qtype)  # 67 rows: a last block of MATVEC_ROWS not full
    blocks = blocks_of(qtype, n, k)
    x = np.random.default_rng(1).standard_normal((19, k)).astype(np.float32)
    W, X = cp.asarray(blocks), cp.asarray(x)
    ours = cp.asnumpy(cuda_kernels.matvec(X, W, qtype, n, k))  # 19 rows: a last tile not full
    assert same_bits(ours, cuda_twins.matvec(x, blocks, qtype))
    alone = [cp.asnumpy(cuda_kernels.matvec(X[b : b + 1], W, qtype, n, k))[0] for b in range(8)]
    for B in range(1, 9):
        batched = cp.asnumpy(cuda_kernels.matvec(X[:B], W, qtype, n, k))
        for b in range(B):
            assert same_bits(batched[b], alone[b]), (B, b)


def test_the_matvec_writes_a_stacked_part_into_its_columns(cp):
    blocks = blocks_of(Q.Q4_K, 40, 512)
    x = np.random.default_rng(2).standard_normal((10, 512)).astype(np.float32)
    out = cp.full((10, 100), 7.0, dtype=np.float32)
    cuda_kernels.matvec(cp.asarray(x), cp.asarray(blocks), Q.Q4_K, 40, 512, out=out[:, 30:70])
    got = cp.asnumpy(out)
    assert same_bits(got[:, 30:70], cuda_twins.matvec(x, blocks, Q.Q4_K))
    assert (got[:, :30] == 7).all() and (got[:, 70:] == 7).all()


def test_x_starting_off_16_bytes_is_copied_before_the_float4_loads(cp, monkeypatch):
    """The mat-vec reads x as float4 (16-byte loads, which fault on a GPU when unaligned):
    an x starting 4 bytes into an allocation is copied by the launcher; without that copy
    the emulator's alignment check stops the kernel."""
    blocks = blocks_of(Q.Q4_1, 9, 64)
    x = np.random.default_rng(5).standard_normal((3, 64)).astype(np.float32)
    buffer = cp.zeros(3 * 64 + 1, dtype=np.float32)
    buffer[1:] = cp.asarray(x.ravel())
    X = buffer[1:].reshape(3, 64)  # contiguous, 4 bytes off the allocation's alignment
    ours = cuda_kernels.matvec(X, cp.asarray(blocks), Q.Q4_1, 9, 64)
    assert same_bits(cp.asnumpy(ours), cuda_twins.matvec(x, blocks, Q.Q4_1))
    monkeypatch.setattr(cuda_kernels, "_aligned", lambda cupy, a: a)
    with pytest.raises(cuda_emu.EmulatorError, match="16-byte aligned"):
        cuda_kernels.matvec(X, cp.asarray(blocks), Q.Q4_1, 9, 64)


def test_a_dense_float32_matrix_is_read_as_f32_blocks(cp):
    # CudaBackend passes a dense weight's float32 array itself as matvec_f32's bytes.
    w = np.random.default_rng(3).standard_normal((9, 64)).astype(np.float32)
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    ours = cuda_kernels.matvec(cp.asarray(x), cp.asarray(w), Q.F32, 9, 64)
    assert same_bits(cp.asnumpy(ours), cuda_twins.matvec(x, w.view(np.uint8), Q.F32))


# ---- per-row ops ----


@pytest.mark.parametrize("shape", [(5, 576), (3, 4, 64), (2, 1000), (1, 7)])
def test_rms_norm_is_its_twin_bitwise(cp, shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    ours = cuda_kernels.rms_norm(cp.asarray(x), cp.asarray(w), 1e-6)
    assert same_bits(cp.asnumpy(ours), cuda_twins.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("on_device", [False, True], ids=["host-positions", "device-positions"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_rope_is_its_twin_bitwise(cp, neox, on_device):
    # 5 rows of 4 heads of 32 pairs: a last block of threads past the end.
    x = np.random.default_rng(4).standard_normal((5, 4, 64)).astype(np.float32)
    cos, sin = numpy_backend.rope_tables(300, 64, 10000.0)
    positions = np.array([0, 17, 255, 256, 299])
    given = cp.asarray(positions) if on_device else positions.tolist()
    ours = cuda_kernels.rope(cp.asarray(x), given, cp.asarray(cos), cp.asarray(sin), neox)
    assert same_bits(cp.asnumpy(ours), cuda_twins.rope(x, positions, cos, sin, neox))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_glu_is_its_twin(cp, activation):
    gate_up = (np.random.default_rng(5).standard_normal((4, 192)) * 4).astype(np.float32)
    gate_up[0, :3] = [-100.0, -88.5, 90.0]
    ours = cp.asnumpy(cuda_kernels.glu(cp.asarray(gate_up), 96, activation))
    # atol 1e-5: where 1 + tanh(inner) cancels (gate near -6), glibc's tanhf and numpy's
    # differ by an ulp of 1, times g * u.
    np.testing.assert_allclose(ours, cuda_twins.glu(gate_up, 96, activation), rtol=4e-6, atol=1e-5)


def test_softcap_is_its_twin(cp):
    x = (np.random.default_rng(6).standard_normal((3, 50)) * 40).astype(np.float32)
    ours = cp.asnumpy(cuda_kernels.softcap(cp.asarray(x), 30.0))
    np.testing.assert_allclose(ours, cuda_twins.softcap(x, 30.0), rtol=4e-6, atol=1e-6)


# ---- attention ----

H, HKV, N_CTX, N_SLOTS = 4, 2, 700, 8
# Positions on both sides of the chunk boundaries, the first and the last of the cache.
POSITIONS = [0, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1, N_CTX - 1]
SLOTS = [3, 0, 7, 1, 2, 5, 4, 6]


def caches(dh: int):
    rng = np.random.default_rng(8)
    shape = (2, N_SLOTS, HKV, N_CTX, dh)
    return tuple(rng.standard_normal(shape, dtype=np.float32) for _ in "kv")


def decode_inputs(dh: int):
    rng = np.random.default_rng(7)
    B = len(POSITIONS)
    return [rng.standard_normal((B, h, dh), dtype=np.float32) for h in (H, HKV, HKV)]


@pytest.mark.parametrize("on_device", [False, True], ids=["host-positions", "device-positions"])
@pytest.mark.parametrize(
    "dh, window, softcap", [(64, 0, 0.0), (64, 300, 0.0), (32, 256, 20.0), (256, 100, 50.0)]
)
def test_attention_is_its_twin_and_writes_the_cache_as_it(cp, dh, window, softcap, on_device):
    q, k, v = decode_inputs(dh)
    ck, cv = caches(dh)
    dev_k, dev_v = cp.asarray(ck), cp.asarray(cv)
    where = (cp.asarray(SLOTS), cp.asarray(POSITIONS)) if on_device else (SLOTS, POSITIONS)
    ours = cuda_kernels.attention_decode(
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        dev_k,
        dev_v,
        1,
        *where,
        dh**-0.5,
        window,
        softcap,
    )
    ref = cuda_twins.attention_decode(
        q, k, v, ck, cv, 1, SLOTS, POSITIONS, dh**-0.5, window, softcap
    )
    np.testing.assert_allclose(cp.asnumpy(ours), ref, rtol=2e-5, atol=2e-6)
    assert same_bits(cp.asnumpy(dev_k), ck) and same_bits(cp.asnumpy(dev_v), cv)


def test_attention_rows_are_bitwise_as_alone(cp):
    q, k, v = (cp.asarray(a) for a in decode_inputs(64))
    history = caches(64)

    def run(rows, on_device=False):
        ck, cv = (cp.asarray(c) for c in history)
        where = ([SLOTS[b] for b in rows], [POSITIONS[b] for b in rows])
        if on_device:  # a captured step's: the grid covers the whole cache
            where = tuple(cp.asarray(w) for w in where)
        out = cuda_kernels.attention_decode(
            q[rows], k[rows], v[rows], ck, cv, 0, *where, 0.125, 300, 30.0
        )
        return cp.asnumpy(out)

    alone = [run([b])[0] for b in range(8)]
    for B in range(1, 9):
        batched = run(list(range(B)), on_device=B % 2 == 0)
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


def test_the_cuda_backend_refuses_attention_sinks(cuda_backend):
    # attention.cu's softmax has no sink term: gpt-oss is a load error, never wrong logits.
    from engine.types import ModelLoadError

    with pytest.raises(ModelLoadError, match="sinks"):
        load("tiny-gptoss.gguf", cuda_backend)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_the_cuda_backend_computes_what_xp_computes_on_numpy(cp, cuda_backend, name):
    ours, ref = load(name, cuda_backend), load(name, XpBackend(np))
    prompt = np.random.default_rng(9).integers(0, 256, size=23)
    logits = []
    for model in (ours, ref):
        kv = model.make_kv_cache(2, 64)
        logits.append(model.forward(prompt, 0, kv, 0, all_logits=True))
        logits.append(model.forward_decode([5, 9], [23, 0], [0, 1], kv))
    assert all(type(a) is np.ndarray for a in logits)  # only host logits come back
    np.testing.assert_allclose(logits[0], logits[2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1], logits[3], rtol=1e-4, atol=1e-4)


def test_each_decode_row_of_the_cuda_backend_is_bitwise_as_alone(cp, cuda_backend):
    # qwen3 (its per-head norms too), four rows alone then together and in another order:
    # each emulated decode step runs the 49152-row head, ~1 s (the kernels' own rows are
    # checked as alone for B = 1..8 above; check_batch_invariance's 17 steps cost 17 s).
    model = load("tiny-qwen3.gguf", cuda_backend)
    lengths = [3, 9, 12, 6]
    kv = model.make_kv_cache(4, 16)
    assert isinstance(kv.k, cp.ndarray)
    rng = np.random.default_rng(3)
    for slot, n in enumerate(lengths):
        model.forward(rng.integers(0, 256, size=n), 0, kv, slot)
    saved = kv.k.copy(), kv.v.copy()
    tokens = [int(t) for t in rng.integers(0, 256, size=4)]

    def decode(rows):
        kv.k[...], kv.v[...] = saved
        return model.forward_decode([tokens[b] for b in rows], [lengths[b] for b in rows], rows, kv)

    alone = [decode([b])[0] for b in range(4)]
    for rows in ([0, 1, 2, 3], [2, 0, 3]):
        for got, b in zip(decode(rows), rows, strict=True):
            assert same_bits(got, alone[b]), (rows, b)


# ---- the shipped models through the CUDA C ----


def first_steps_match_the_reference(model, f32: dict, steps: int) -> None:
    """The prompt prefilled (dequantise kernels + matmul), then `steps` greedy tokens
    through the decode kernels: the reference's tokens, top-5 logits within 1e-2 (the
    README's tolerance; seen here within 3e-5)."""
    case = f32["greedy"][0]
    prompt, expected = as_list(case["prompt_ids"]), as_list(case["greedy_ids"])
    kv = model.make_kv_cache(1, len(prompt) + steps + 1)
    logits = model.forward(np.asarray(prompt), 0, kv, 0)
    for step in range(steps):
        ref = as_list(case["steps"])[step]
        np.testing.assert_allclose(logits[ref["top_ids"]], ref["top_logits"], atol=1e-2)
        token = int(np.argmax(logits))
        assert token == expected[step], step
        logits = model.forward_decode([token], [len(prompt) + step], [0], kv)[0]


def reference(name: str) -> dict:
    """The float32 PyTorch reference the engine tests use (tests/reference)."""
    return json.loads((Path(__file__).parents[2] / "reference" / name / "f32.json").read_text())


def test_smollm2_on_the_emulated_cuda_kernels_gives_the_reference_tokens(
    cp, cuda_backend, smollm2_path
):
    # Q4_1 matrices and the Q8_0 tied head; ~5 s a decode step here.
    gf = GGUFFile(smollm2_path)
    model = architecture_module(gf.architecture).load(gf, backend=cuda_backend)
    first_steps_match_the_reference(model, reference("smollm2-135m-instruct"), steps=3)


def test_gemma3_on_the_emulated_cuda_kernels_gives_the_reference_tokens(
    cp, cuda_backend, gemma3_path
):
    # Q4_K / Q6_K / Q8_0 matrices, sliding-window layers, the 262144-row head: ~9 s a step.
    gf = GGUFFile(gemma3_path)
    model = architecture_module(gf.architecture).load(gf, backend=cuda_backend)
    first_steps_match_the_reference(model, reference("gemma-3-270m"), steps=1)


# ---- the emulator finds what it is for ----

BROKEN = {
    "a __syncthreads in a divergent branch": (
        "if (threadIdx.x < 64) __syncthreads();",
        "returned while others of the block wait at __syncthreads",
    ),
    "a shuffle after a lane returned": (
        "if (threadIdx.x % 32 == 0) return; v = __shfl_xor_sync(0xffffffffu, v, 1);",
        "a full-warp shuffle after a lane of the warp returned",
    ),
    "a lane returning while its warp shuffles": (
        "if (threadIdx.x % 32 == 31) return; v = __shfl_xor_sync(0xffffffffu, v, 1);",
        "returned while others of its warp wait at a shuffle",
    ),
    "__syncthreads after a thread returned": (
        "if (threadIdx.x == 0) return; __syncthreads();",
        "__syncthreads after some threads of the block returned",
    ),
    "lanes shuffling at different lines": (
        "if (threadIdx.x % 2) v = __shfl_xor_sync(0xffffffffu, v, 1);\n"
        "        else v = __shfl_xor_sync(0xffffffffu, v, 1);",
        "shuffle at different lines",
    ),
    "lanes of a warp at a shuffle and at __syncthreads": (
        "if (threadIdx.x % 2) v = __shfl_xor_sync(0xffffffffu, v, 1); else __syncthreads();",
        "deadlock",
    ),
    "a write past the end": ("y[threadIdx.x + 1] = v;", "wrote outside"),
}


@pytest.fixture(scope="module")
def broken(cp):
    """One program of BROKEN's kernels (a g++ run each would cost a second)."""
    kernels = [
        f"""extern "C" __global__ void broken{i}(float* y, int n) {{
            float v = (float)threadIdx.x;
            {body}
            if (threadIdx.x < n) y[threadIdx.x] = v;
        }}"""
        for i, (body, _) in enumerate(BROKEN.values())
    ]
    return cp.RawModule(code="\n".join(kernels))


@pytest.mark.parametrize("name", BROKEN)
def test_the_emulator_reports_a_kernel_breaking_cudas_rules(cp, broken, name):
    kernel = broken.get_function(f"broken{list(BROKEN).index(name)}")
    y = cp.zeros(128, dtype=np.float32)
    with pytest.raises(cuda_emu.EmulatorError, match=BROKEN[name][1]):
        kernel((1,), (128,), (y, np.int32(128)))


def test_the_emulator_checks_arguments_as_the_kernel_declares_them(cp):
    rms = cp.RawModule(code=cuda_kernels.program("ops.cu")).get_function("rms_norm")
    x, w, y = (cp.zeros((2, 8), dtype=np.float32) for _ in range(3))
    with pytest.raises(TypeError, match="host array"):
        rms((2,), (256,), (np.zeros((2, 8), np.float32), w, y, np.int32(8), np.float32(0)))
    with pytest.raises(TypeError, match="does not fit"):
        rms((2,), (256,), (x, w, y, 8, np.float32(0)))  # CuPy would pass 8 bytes
    with pytest.raises(TypeError, match="does not fit"):
        rms((2,), (256,), (x, w, y, np.int32(8), 1e-6))  # a double for a float
    with pytest.raises(TypeError, match="int32 array"):
        rms((2,), (256,), (x, w, cp.zeros(16, np.int32), np.int32(8), np.float32(0)))
    with pytest.raises(TypeError, match="takes 5 arguments"):
        rms((2,), (256,), (x, w, y, np.int32(8)))
