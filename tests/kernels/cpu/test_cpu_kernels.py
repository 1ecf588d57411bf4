"""The compiled CPU kernels (kernels._cpu) against gguf-py's dequantizers, on every ISA
level this CPU runs: dequantize is bitwise gguf's; linear is the float32 product within
float32 rounding, and a row's bits never depend on the batch, its neighbours, its column
offset or the thread count."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

try:
    from kernels import _cpu
except ImportError as exc:  # pragma: no cover - depends on the build
    _reason = f"kernels._cpu does not import ({exc}); build it with `make cpu-kernels`"
    if os.environ.get("PANTHEON_TESTS_STRICT") == "1":
        pytest.fail(_reason, pytrace=False)
    pytest.skip(_reason, allow_module_level=True)

QTYPES = dict(_cpu.QTYPES)
ISAS = _cpu.supported_isas()
FLOAT_TYPES = {"F32", "F16", "BF16"}
K_QUANTS = {"Q4_K", "Q5_K", "Q6_K"}
# gguf-py quantises these itself; the K-quants it only dequantises (random blocks then).
GGUF_QUANTISES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "MXFP4"}


def f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def make_weights(name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid weights of type `name`, as the GGUF file holds them: (n, row_bytes) uint8
    blocks, or the (n, k) float32 / uint16 values of a float type."""
    values = rng.standard_normal((n, k)).astype(np.float32) * 0.5
    qtype = GGMLQuantizationType[name]
    if name == "F32":
        return values
    if name == "F16":
        return values.astype(np.float16).view(np.uint16)
    if name in GGUF_QUANTISES:
        w = quants.quantize(values, qtype)
        return w.view(np.uint16).reshape(n, k) if name == "BF16" else w
    # Random K-quant blocks with finite, moderate f16 super-block scales.
    bs, ts = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, k // bs, ts), dtype=np.uint8)
    scale = rng.uniform(0.001, 0.05, (n, k // bs))
    if name == "Q6_K":
        blocks[..., 208:210] = f16_bytes(scale * rng.choice([-1, 1], scale.shape))
    else:
        blocks[..., 0:2] = f16_bytes(scale)
        blocks[..., 2:4] = f16_bytes(rng.uniform(0.0, 0.05, scale.shape))
    return blocks.reshape(n, -1)


def oracle(name: str, w: np.ndarray) -> np.ndarray:
    """gguf-py's float32 values of w."""
    if name == "F32":
        return w
    if name == "F16":
        return w.view(np.float16).astype(np.float32)
    return quants.dequantize(np.ascontiguousarray(w).view(np.uint8), GGMLQuantizationType[name])


def ks_for(name: str) -> list[int]:
    if name in K_QUANTS:
        return [256, 512, 768]
    if name in FLOAT_TYPES:
        return [32, 576, 7, 45]  # float rows have no blocks: odd K exercise the tail
    return [32, 64, 288, 576]


@pytest.fixture(params=ISAS)
def isa(request):
    before = _cpu.isa()
    _cpu.set_isa(request.param)
    yield request.param
    _cpu.set_isa(before)


@pytest.fixture
def threads():
    before = _cpu.get_threads()
    yield _cpu.set_threads
    _cpu.set_threads(before)


def test_module_reports_its_types_isa_and_threads():
    assert QTYPES == {
        "F32": 0,
        "F16": 1,
        "Q4_0": 2,
        "Q4_1": 3,
        "Q5_0": 6,
        "Q5_1": 7,
        "Q8_0": 8,
        "Q4_K": 12,
        "Q5_K": 13,
        "Q6_K": 14,
        "BF16": 30,
        "MXFP4": 39,
    }
    for name, qt in QTYPES.items():
        assert int(GGMLQuantizationType[name]) == qt
    assert ISAS[0] == "generic" and _cpu.isa() in ISAS
    assert _cpu.get_threads() >= 1


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_dequantize_is_bitwise_gguf(isa, name):
    rng = np.random.default_rng(1)
    for n, k in [(1, ks_for(name)[0]), (17, ks_for(name)[-1]), (5, ks_for(name)[1])]:
        w = make_weights(name, n, k, rng)
        out = np.full((n, k), np.nan, dtype=np.float32)
        _cpu.dequantize(QTYPES[name], w, out)
        ref = oracle(name, w)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (isa, name, n, k)


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_linear_is_the_float32_product(isa, name):
    rng = np.random.default_rng(2)
    for k in ks_for(name):
        for n in (1, 17):
            w = make_weights(name, n, k, rng)
            wf = oracle(name, w).astype(np.float64)
            x = rng.standard_normal((9, k)).astype(np.float32)
            out = np.full((9, n), np.nan, dtype=np.float32)
            _cpu.linear(QTYPES[name], w, x, out)
            ref = x.astype(np.float64) @ wf.T
            bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(wf).T) + 1e-30
            assert np.all(np.abs(out - ref) <= bound), (isa, name, n, k)


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_a_row_has_the_same_bits_in_any_batch_beside_any_rows_at_any_column(isa, name):
    rng = np.random.default_rng(3)
    k = ks_for(name)[-1] if name not in FLOAT_TYPES else 45
    n = 23
    w = make_weights(name, n, k, rng)
    qt = QTYPES[name]
    x = rng.standard_normal((17, k)).astype(np.float32)
    alone = []
    for b in range(17):
        o = np.empty((1, n), dtype=np.float32)
        _cpu.linear(qt, w, x[b : b + 1], o)
        alone.append(o[0])
    for B in range(1, 18):  # past 8: tiles of 4 x-rows, then the rest (linear_simd.h x_block)
        out = np.empty((B, n), dtype=np.float32)
        _cpu.linear(qt, w, x[:B], out)
        for b in range(B):
            assert np.array_equal(out[b], alone[b]), (isa, name, B, b)
    # Other neighbours, another position in the batch, a column offset in a wider out.
    order = [6, 2, 8, 0, 4]
    mixed = np.concatenate([x[order], rng.standard_normal((3, k)).astype(np.float32) * 100])
    wide = np.full((8, n + 11), np.nan, dtype=np.float32)
    _cpu.linear(qt, w, mixed, wide, col0=7)
    for j, b in enumerate(order):
        assert np.array_equal(wide[j, 7 : 7 + n], alone[b]), (isa, name, b)
    assert np.isnan(wide[:, :7]).all() and np.isnan(wide[:, 7 + n :]).all()


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16", "Q5_0"])
def test_the_thread_count_changes_no_bit(isa, threads, name):
    rng = np.random.default_rng(4)
    k = 512 if name in K_QUANTS else 576
    n = 333  # several thread chunks, not a multiple of any of them
    w = make_weights(name, n, k, rng)
    x = rng.standard_normal((5, k)).astype(np.float32)
    results = []
    for t in (1, 2, 3):
        threads(t)
        out = np.empty((5, n), dtype=np.float32)
        _cpu.linear(QTYPES[name], w, x, out)
        deq = np.empty((n, k), dtype=np.float32)
        _cpu.dequantize(QTYPES[name], w, deq)
        results.append((out, deq))
    for out, deq in results[1:]:
        assert np.array_equal(out, results[0][0])
        assert np.array_equal(deq, results[0][1])


def test_isas_agree_within_rounding():
    rng = np.random.default_rng(5)
    w = make_weights("Q4_1", 64, 576, rng)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    before = _cpu.isa()
    outs = []
    try:
        for level in ISAS:
            _cpu.set_isa(level)
            out = np.empty((3, 64), dtype=np.float32)
            _cpu.linear(QTYPES["Q4_1"], w, x, out)
            outs.append(out)
    finally:
        _cpu.set_isa(before)
    for out in outs[1:]:
        np.testing.assert_allclose(out, outs[0], rtol=1e-4, atol=1e-4)


def test_env_var_forces_a_lower_isa_only():
    code = "from kernels import _cpu; print(_cpu.isa())"
    env = dict(os.environ, PANTHEON_CPU_ISA="generic")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "generic"
    env["PANTHEON_CPU_ISA"] = "sse9"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "PANTHEON_CPU_ISA" in run.stderr
    with pytest.raises(ValueError):
        _cpu.set_isa("sse9")


def test_bad_inputs_raise_instead_of_crashing():
    rng = np.random.default_rng(6)
    qt = QTYPES["Q4_1"]
    w = make_weights("Q4_1", 8, 64, rng)  # (8, 40) bytes
    x = rng.standard_normal((2, 64)).astype(np.float32)
    out = np.empty((2, 8), dtype=np.float32)
    _cpu.linear(qt, w, x, out)  # the valid call

    with pytest.raises(ValueError, match="bytes"):
        _cpu.linear(qt, w[:, :39].copy(), x, out)  # not whole blocks
    with pytest.raises(ValueError, match="K=96"):
        _cpu.linear(qt, w, rng.standard_normal((2, 96)).astype(np.float32), out)
    with pytest.raises(ValueError, match="K=32"):
        _cpu.linear(qt, w, x[:, :32].copy(), out)
    with pytest.raises(TypeError, match="float32"):
        _cpu.linear(qt, w, x.astype(np.float64), out)
    with pytest.raises(TypeError, match="float32"):
        _cpu.linear(qt, w, x, out.astype(np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        _cpu.linear(qt, w, np.asfortranarray(np.ones((2, 64), np.float32)), out)
    with pytest.raises(ValueError, match="C-contiguous"):
        _cpu.linear(qt, np.concatenate([w, w], axis=1)[:, ::2], x, out)
    with pytest.raises(ValueError, match="columns"):
        _cpu.linear(qt, w, x, np.empty((2, 7), np.float32))
    with pytest.raises(ValueError, match="columns"):
        _cpu.linear(qt, w, x, np.empty((2, 12), np.float32), col0=5)
    with pytest.raises(ValueError, match="columns"):
        _cpu.linear(qt, w, x, out, col0=-1)
    with pytest.raises(ValueError, match="rows"):
        _cpu.linear(qt, w, x, np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="share memory"):
        _cpu.linear(qt, w, x, x)  # out (2, 64) would overwrite x while reading it
    with pytest.raises(ValueError, match="share memory"):
        _cpu.dequantize(QTYPES["F32"], x, x)
    readonly = np.empty((2, 8), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _cpu.linear(qt, w, x, readonly)
    with pytest.raises(ValueError, match="2-D"):
        _cpu.linear(qt, w.ravel(), x, out)
    with pytest.raises(ValueError, match="no compiled kernel"):
        _cpu.linear(16, w, x, out)  # IQ2_XXS
    with pytest.raises(TypeError):
        _cpu.linear(qt, "weights", x, out)
    with pytest.raises(TypeError):
        _cpu.linear("Q4_1", w, x, out)

    deq = np.empty((8, 64), np.float32)
    _cpu.dequantize(qt, w, deq)
    with pytest.raises(ValueError, match=r"\(8, 64\)"):
        _cpu.dequantize(qt, w, np.empty((8, 63), np.float32))
    with pytest.raises(ValueError, match=r"\(8, 64\)"):
        _cpu.dequantize(qt, w, np.empty((9, 64), np.float32))
    with pytest.raises(TypeError, match="float32"):
        _cpu.dequantize(qt, w, np.empty((8, 64), np.float64))
    with pytest.raises(ValueError, match="bytes"):
        _cpu.dequantize(QTYPES["Q4_K"], w, deq)

    with pytest.raises(ValueError):
        _cpu.set_threads(0)
    with pytest.raises(TypeError):
        _cpu.set_isa(3)


def test_empty_products_are_fine():
    w = np.zeros((0, 20), np.uint8)
    x = np.ones((3, 32), np.float32)
    out = np.full((3, 4), 7.0, np.float32)
    _cpu.linear(QTYPES["Q4_1"], w, x, out, col0=4)
    assert (out == 7.0).all()
    _cpu.linear(QTYPES["F32"], np.zeros((4, 0), np.float32), np.ones((3, 0), np.float32), out)
    assert (out == 0.0).all()


# ---- linear_prefill: many rows of x (a prompt chunk) through dequantised tiles ----


@pytest.mark.parametrize("name", sorted(QTYPES))
def test_linear_prefill_is_the_float32_product(isa, name):
    rng = np.random.default_rng(14)
    qt = QTYPES[name]
    for k in ks_for(name):
        for t, n in [(1, 17), (5, 1), (17, 67), (130, 35)]:
            w = make_weights(name, n, k, rng)
            wf = oracle(name, w).astype(np.float64)
            x = rng.standard_normal((t, k)).astype(np.float32)
            out = np.full((t, n + 5), np.nan, dtype=np.float32)
            _cpu.linear_prefill(qt, w, x, out, col0=3)
            ref = x.astype(np.float64) @ wf.T
            bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(wf).T) + 1e-30
            assert np.all(np.abs(out[:, 3 : 3 + n] - ref) <= bound), (isa, name, t, n, k)
            assert np.isnan(out[:, :3]).all() and np.isnan(out[:, 3 + n :]).all()


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "F16", "F32"])
def test_linear_prefill_bits_ignore_threads_chunk_and_neighbour_rows(isa, threads, name):
    """An output's bits depend on its x row and W row only: not on the thread count (the
    tiles differ), the other tokens of the chunk (T > 4) or which rows share its tile."""
    rng = np.random.default_rng(15)
    k = 768 if name in K_QUANTS else (45 if name in FLOAT_TYPES else 1536)
    n = 203  # several tiles at any thread count, not a multiple of 4
    w = make_weights(name, n, k, rng)
    qt = QTYPES[name]
    x = rng.standard_normal((130, k)).astype(np.float32)
    results = []
    for t in (1, 2, 3):
        threads(t)
        out = np.empty((130, n), dtype=np.float32)
        _cpu.linear_prefill(qt, w, x, out)
        results.append(out)
    for out in results[1:]:
        assert np.array_equal(out, results[0]), (isa, name)
    full = results[0]
    part = np.empty((7, n), dtype=np.float32)
    _cpu.linear_prefill(qt, w, x[61:68], part)
    assert np.array_equal(part, full[61:68])
    some = np.empty((130, n - 9), dtype=np.float32)
    _cpu.linear_prefill(qt, w[9:], x, some)
    assert np.array_equal(some, full[:, 9:])


def test_linear_prefill_rejects_what_linear_rejects():
    rng = np.random.default_rng(16)
    qt = QTYPES["Q4_1"]
    w = make_weights("Q4_1", 8, 64, rng)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    out = np.empty((9, 8), dtype=np.float32)
    _cpu.linear_prefill(qt, w, x, out)  # the valid call
    with pytest.raises(ValueError, match="bytes"):
        _cpu.linear_prefill(qt, w[:, :39].copy(), x, out)
    with pytest.raises(ValueError, match="K=96"):
        _cpu.linear_prefill(qt, w, rng.standard_normal((9, 96)).astype(np.float32), out)
    with pytest.raises(TypeError, match="float32"):
        _cpu.linear_prefill(qt, w, x.astype(np.float64), out)
    with pytest.raises(TypeError, match="float32"):
        _cpu.linear_prefill(qt, w, x, out.astype(np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        _cpu.linear_prefill(qt, w, np.asfortranarray(x), out)
    with pytest.raises(ValueError, match="columns"):
        _cpu.linear_prefill(qt, w, x, np.empty((9, 12), np.float32), col0=5)
    with pytest.raises(ValueError, match="columns"):
        _cpu.linear_prefill(qt, w, x, out, col0=-1)
    with pytest.raises(ValueError, match="rows"):
        _cpu.linear_prefill(qt, w, x, np.empty((8, 8), np.float32))
    with pytest.raises(ValueError, match="share memory"):
        _cpu.linear_prefill(qt, w, x, x)
    readonly = np.empty((9, 8), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _cpu.linear_prefill(qt, w, x, readonly)
    with pytest.raises(ValueError, match="2-D"):
        _cpu.linear_prefill(qt, w.ravel(), x, out)
    with pytest.raises(ValueError, match="no compiled kernel"):
        _cpu.linear_prefill(16, w, x, out)
    with pytest.raises(TypeError):
        _cpu.linear_prefill(qt, "weights", x, out)
    # Empty products: nothing written for N = 0, zeros for K = 0.
    out = np.full((9, 4), 7.0, np.float32)
    _cpu.linear_prefill(qt, np.zeros((0, 20), np.uint8), np.ones((9, 32), np.float32), out)
    assert (out == 7.0).all()
    _cpu.linear_prefill(
        QTYPES["F32"], np.zeros((4, 0), np.float32), np.ones((9, 0), np.float32), out
    )
    assert (out == 0.0).all()


# ---- decode ops: attention over the KV cache, RMS norm, RoPE ----


def _attention_case(rng, *, B, H, Hkv, Dh, n_ctx, positions, window=0, softcap=0.0):
    from kernels.kv_cache import KVCache
    from kernels.reference.backend import NumpyBackend

    n_layer, n_slots, layer = 2, 6, 1
    kv_ref = KVCache(n_layer, n_slots, Hkv, n_ctx, Dh)
    kv = KVCache(n_layer, n_slots, Hkv, n_ctx, Dh)
    history = rng.standard_normal((2, n_layer, n_slots, Hkv, n_ctx, Dh)).astype(np.float32)
    for cache in (kv_ref, kv):
        cache.k[...] = history[0]
        cache.v[...] = history[1]
    slots = rng.permutation(n_slots)[:B].astype(np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    q = rng.standard_normal((B, H, Dh)).astype(np.float32)
    k = rng.standard_normal((B, Hkv, Dh)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, Dh)).astype(np.float32)
    scale = 1.0 / np.sqrt(Dh)
    ref = NumpyBackend().attention_decode(
        q, k, v, kv_ref, layer, slots, positions, scale, window, softcap
    )
    out = np.full((B, H * Dh), np.nan, dtype=np.float32)
    args = (q, k, v, kv.k, kv.v, layer, slots, positions, scale, window, softcap, out)
    _cpu.attention_decode(*args)
    return ref, out, kv_ref, kv, args


@pytest.mark.parametrize(
    "shape",
    [
        dict(B=3, H=9, Hkv=3, Dh=64, n_ctx=40, positions=[0, 17, 39]),  # SmolLM2 heads
        dict(B=2, H=4, Hkv=1, Dh=256, n_ctx=70, positions=[69, 5], window=16, softcap=0.0),
        dict(B=4, H=8, Hkv=4, Dh=24, n_ctx=33, positions=[3, 32, 10, 0], softcap=30.0),
        dict(B=1, H=2, Hkv=2, Dh=7, n_ctx=9, positions=[8], window=3, softcap=5.0),
    ],
)
def test_attention_decode_matches_the_numpy_backend(shape):
    rng = np.random.default_rng(7)
    ref, out, kv_ref, kv, _ = _attention_case(rng, **shape)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    # The new keys and values went where the numpy backend wrote them, nothing else moved.
    assert np.array_equal(kv.k, kv_ref.k) and np.array_equal(kv.v, kv_ref.v)


def test_attention_decode_rows_are_batch_invariant(threads):
    rng = np.random.default_rng(8)
    _, out, _, kv, args = _attention_case(
        rng, B=5, H=6, Hkv=2, Dh=32, n_ctx=300, positions=[299, 3, 150, 0, 77], window=100
    )
    q, k, v, kc, vc, layer, slots, positions, scale, window, softcap, _ = args
    for t in (1, 2):
        threads(t)
        for b in range(5):
            alone = np.empty((1, 6 * 32), dtype=np.float32)
            sl = slice(b, b + 1)
            _cpu.attention_decode(
                q[sl], k[sl], v[sl], kc, vc, layer, slots[sl], positions[sl], scale, window,
                softcap, alone,
            )  # fmt: skip
            assert np.array_equal(alone[0], out[b]), (t, b)


def test_attention_decode_rejects_bad_inputs():
    rng = np.random.default_rng(9)
    _, _, _, _, args = _attention_case(rng, B=2, H=4, Hkv=2, Dh=8, n_ctx=10, positions=[1, 2])
    q, k, v, kc, vc, layer, slots, positions, scale, window, softcap, out = args

    def call(**change):
        a = dict(q=q, k=k, v=v, kcache=kc, vcache=vc, layer=layer, slots=slots)
        a.update(positions=positions, scale=scale, window=window, softcap=softcap, out=out)
        a.update(change)
        _cpu.attention_decode(**a)

    call()
    with pytest.raises(ValueError, match="position"):
        call(positions=np.array([1, 10], np.int64))
    with pytest.raises(ValueError, match="slot"):
        call(slots=np.array([0, 6], np.int64))
    with pytest.raises(ValueError, match="twice"):
        call(slots=np.array([3, 3], np.int64), positions=np.array([2, 2], np.int64))
    call(slots=np.array([3, 3], np.int64))  # one slot's consecutive rows: a verify pass
    with pytest.raises(TypeError, match="int64"):
        call(slots=slots.astype(np.int32))
    with pytest.raises(ValueError, match="layer"):
        call(layer=2)
    with pytest.raises(ValueError, match="out"):
        call(out=np.empty((2, 31), np.float32))
    with pytest.raises(ValueError, match="k and v"):
        call(k=k[:, :1].copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        call(q=np.ascontiguousarray(q.transpose(1, 0, 2)).transpose(1, 0, 2))
    with pytest.raises(ValueError, match="Hkv"):
        call(q=np.ones((2, 3, 8), np.float32), out=np.empty((2, 24), np.float32))
    ro = kc.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        call(kcache=ro)


def _prefill_case(H, Hkv, Dh, T, start, window, softcap, n_ctx=None, seed=0):
    """attention_prefill of one chunk against the numpy backend, from the same history."""
    from kernels.kv_cache import KVCache
    from kernels.reference.backend import NumpyBackend

    rng = np.random.default_rng(seed)
    n_ctx = n_ctx or start + T + 3
    q = rng.standard_normal((T, H, Dh)).astype(np.float32)
    k, v = (rng.standard_normal((T, Hkv, Dh)).astype(np.float32) for _ in range(2))
    history = rng.standard_normal((2, Hkv, start, Dh)).astype(np.float32)
    caches = []
    for _ in range(2):
        kv = KVCache(2, 3, Hkv, n_ctx, Dh)
        kv.k[1, 2, :, :start], kv.v[1, 2, :, :start] = history
        caches.append(kv)
    scale = 1.0 / np.sqrt(Dh)
    ref = NumpyBackend().attention_prefill(q, k, v, caches[0], 1, 2, start, scale, window, softcap)
    out = np.full((T, H * Dh), np.nan, dtype=np.float32)
    args = (q, k, v, caches[1].k, caches[1].v, 1, 2, start, scale, window, softcap, out)
    _cpu.attention_prefill(*args)
    return ref, out, caches, args


# Dh 64: the AVX-512 tiles where the CPU has them; Dh 48 (and any CPU without AVX-512):
# the portable loops.
@pytest.mark.parametrize("H,Hkv", [(9, 3), (8, 2), (4, 4)])
@pytest.mark.parametrize("Dh", [64, 48])
def test_attention_prefill_matches_the_numpy_backend(H, Hkv, Dh):
    for T in (1, 13, 70):
        for start in (0, 1900):
            for window in (0, 5, 512):
                for softcap in (0.0, 30.0):
                    case = (T, start, window, softcap)
                    ref, out, (kv_ref, kv), _ = _prefill_case(H, Hkv, Dh, *case, seed=T + start)
                    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg=str(case))
                    assert np.array_equal(kv.k, kv_ref.k) and np.array_equal(kv.v, kv_ref.v)


@pytest.mark.parametrize("Dh", [64, 48])
def test_attention_prefill_row_bits_ignore_threads_and_chunking(threads, Dh):
    """A query row's result is the same bits on any thread count and in any chunk split
    (the blocks of rows a job takes change with both)."""
    H, Hkv, T, start, window = 9, 3, 70, 300, 120
    _, whole, _, args = _prefill_case(H, Hkv, Dh, T, start, window, 0.0, seed=4)
    q, k, v, kc, vc, layer, slot, _, scale, _, softcap, _ = args
    for t in (1, 2, 3):
        threads(t)
        for cut in (1, 17, 40):
            out = np.empty_like(whole)
            for lo, hi in ((0, cut), (cut, T)):
                _cpu.attention_prefill(
                    q[lo:hi], k[lo:hi], v[lo:hi], kc, vc, layer, slot, start + lo, scale,
                    window, softcap, out[lo:hi],
                )  # fmt: skip
            assert np.array_equal(out, whole), (t, cut)


def test_attention_prefill_out_of_memory_raises_memory_error():
    """A job's scratch that cannot be allocated is a MemoryError, not a crash (a child
    process under an address-space limit the caches fit in and the scratch does not)."""
    code = """
import resource, numpy as np
from kernels import _cpu
_cpu.set_threads(1)
n_ctx, Dh, H, T = 200_000, 16, 48, 4
kc, vc = (np.zeros((1, 1, 1, n_ctx, Dh), np.float32) for _ in range(2))
q = np.ones((T, H, Dh), np.float32)
k = v = np.ones((T, 1, Dh), np.float32)
out = np.empty((T, H * Dh), np.float32)
_cpu.attention_prefill(q, k, v, kc, vc, 0, 0, 10, 0.25, 0, 0.0, out)  # small: fine
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1])
resource.setrlimit(resource.RLIMIT_AS, ((vm + 16 * 1024) * 1024,) * 2)
try:
    _cpu.attention_prefill(q, k, v, kc, vc, 0, 0, n_ctx - T, 0.25, 0, 0.0, out)
except MemoryError:
    print("MemoryError")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MemoryError"


def test_rms_norm_matches_numpy():
    from kernels.reference.backend import rms_norm

    rng = np.random.default_rng(10)
    for n, d in [(1, 576), (7, 640), (3, 5)]:
        x = (rng.standard_normal((n, d)) * rng.uniform(0.01, 30)).astype(np.float32)
        w = rng.standard_normal(d).astype(np.float32)
        out = np.empty_like(x)
        _cpu.rms_norm(x, w, 1e-5, out)
        np.testing.assert_allclose(out, rms_norm(x, w, 1e-5), rtol=1e-6, atol=1e-7)
        alone = np.empty_like(x[-1:])
        _cpu.rms_norm(x[-1:], w, 1e-5, alone)  # a row alone: the same bits
        assert np.array_equal(alone[0], out[-1])
    with pytest.raises(ValueError):
        _cpu.rms_norm(x, w[:-1], 1e-5, out)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_matches_numpy_in_place(neox):
    from kernels.reference.backend import apply_rope_interleaved, apply_rope_neox, rope_tables

    rng = np.random.default_rng(11)
    cos, sin = rope_tables(64, 32, 10000.0)
    x = rng.standard_normal((5, 3, 32)).astype(np.float32)
    positions = np.array([0, 63, 7, 7, 30], dtype=np.int64)
    apply = apply_rope_neox if neox else apply_rope_interleaved
    ref = apply(x, cos[positions], sin[positions])
    y = x.copy()
    _cpu.rope(y, positions, cos, sin, neox)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="position"):
        _cpu.rope(y, np.array([0, 1, 2, 3, 64], np.int64), cos, sin, neox)
    with pytest.raises(ValueError):
        _cpu.rope(y, positions, cos[:, :8].copy(), sin[:, :8].copy(), neox)


# ---- the thread pool ----


def test_concurrent_callers_and_many_jobs_get_exact_results(threads):
    """Python threads calling at once (one gets the pool, the others run on their own
    thread) and thousands of back-to-back jobs: every result is the single-thread one."""
    import threading

    rng = np.random.default_rng(12)
    w = make_weights("Q4_1", 401, 576, rng)
    xs = [rng.standard_normal((b % 3 + 1, 576)).astype(np.float32) for b in range(6)]
    threads(1)
    expected = []
    for x in xs:
        out = np.empty((x.shape[0], 401), np.float32)
        _cpu.linear(QTYPES["Q4_1"], w, x, out)
        expected.append(out)
    threads(3)
    failures = []

    def hammer(k):
        for i in range(150):
            x = xs[(k + i) % len(xs)]
            out = np.empty((x.shape[0], 401), np.float32)
            _cpu.linear(QTYPES["Q4_1"], w, x, out)
            if not np.array_equal(out, expected[(k + i) % len(xs)]):
                failures.append((k, i))

    workers = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in workers)
    assert failures == []


def test_a_forked_child_still_computes(threads):
    """After fork the child has no pool workers: the caller does every job itself."""
    import multiprocessing

    threads(2)
    rng = np.random.default_rng(13)
    w = make_weights("Q8_0", 300, 576, rng)
    x = rng.standard_normal((2, 576)).astype(np.float32)
    out = np.empty((2, 300), np.float32)
    _cpu.linear(QTYPES["Q8_0"], w, x, out)  # the parent's workers exist now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_linear, args=(w, x, queue))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert np.array_equal(queue.get(timeout=5), out)


def _child_linear(w, x, queue):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    _cpu.linear(QTYPES["Q8_0"], w, x, out)
    queue.put(out)


@pytest.mark.parametrize("act", [0, 1], ids=["silu", "gelu_tanh"])
def test_glu_matches_float64_over_the_whole_range(act):
    """The vectorised activations against float64 math: tiny, ordinary, huge and
    non-finite gates, odd widths (the vector loop's tail), rows independent."""
    rng = np.random.default_rng(17)
    F = 1539
    gate = np.concatenate(
        [
            rng.standard_normal(F - 15) * 4,
            [0.0, -0.0, 1e-30, -1e-30, 1e-4, -1e-4, 30.0, -30.0, 88.0, -88.0, 100.0, -100.0],
            [1e30, -1e30, np.inf],
        ]
    ).astype(np.float32)
    up = rng.standard_normal(F).astype(np.float32)
    gate_up = np.stack([np.concatenate([gate, up]), np.concatenate([gate[::-1], up])])
    out = np.empty((2, F), np.float32)
    _cpu.glu(gate_up, act, out)

    g, u = gate_up[:, :F].astype(np.float64), gate_up[:, F:].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if act == 0:
            want = g / (1.0 + np.exp(-g)) * u
        else:
            # 0.5 g (1 + tanh(y)) as g sigmoid(2y): float64's 1 + tanh(y) cancels too
            want = g / (1.0 + np.exp(-2.0 * 0.7978845608 * (g + 0.044715 * g**3))) * u
    finite = np.isfinite(want)
    # gelu: far in the tail the float32 rounding of the cubic moves exp's argument by an ulp
    np.testing.assert_allclose(
        out[finite], want[finite], rtol=2e-6 if act == 0 else 1e-5, atol=1e-30
    )
    assert np.array_equal(np.isnan(out), np.isnan(want))
    one = np.empty((1, F), np.float32)
    _cpu.glu(gate_up[1:], act, one)
    assert np.array_equal(one[0], out[1])  # a row's bits do not depend on the others


def test_glu_has_the_same_bits_on_every_isa(tmp_path):
    """The AVX-512 activation does the scalar loop's operations in its order: a process
    forced to the portable code (PANTHEON_CPU_ISA=generic) gets the same bits."""
    rng = np.random.default_rng(19)
    gate_up = (rng.standard_normal((3, 2 * 1541)) * 6).astype(np.float32)
    np.save(tmp_path / "gu.npy", gate_up)
    code = (
        "import numpy as np, sys; from kernels import _cpu\n"
        "gu = np.load(sys.argv[1]); F = gu.shape[1] // 2\n"
        "for act in (0, 1):\n"
        "    out = np.empty((gu.shape[0], F), np.float32); _cpu.glu(gu, act, out)\n"
        "    np.save(sys.argv[2] + str(act) + '.npy', out)\n"
    )
    outs = {}
    for isa in ("generic", ISAS[-1]):
        env = dict(os.environ, PANTHEON_CPU_ISA=isa)
        prefix = str(tmp_path / isa)
        run = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "gu.npy"), prefix],
            env=env,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        outs[isa] = [np.load(prefix + f"{act}.npy") for act in (0, 1)]
    for a, b in zip(outs["generic"], outs[ISAS[-1]], strict=True):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize(
    "shape",
    [
        dict(B=1, H=9, Hkv=3, Dh=64, n_ctx=3000, positions=[2999]),  # SmolLM2 deep in context
        dict(B=2, H=8, Hkv=2, Dh=128, n_ctx=700, positions=[650, 129], window=200),
        dict(B=3, H=4, Hkv=1, Dh=256, n_ctx=400, positions=[399, 0, 64], softcap=50.0),
    ],
)
def test_attention_decode_by_kv_head_has_the_per_head_bits(shape, threads):
    """With one thread the heads sharing a KV head are attended together (attn_group);
    with more threads than KV-head jobs each head alone (attn_one): the same bits."""
    rng = np.random.default_rng(10)
    threads(1)
    ref, grouped, _, _, args = _attention_case(rng, **shape)
    np.testing.assert_allclose(grouped, ref, rtol=1e-5, atol=1e-6)
    threads(64)
    per_head = np.full_like(grouped, np.nan)
    q, k, v, kc, vc, layer, slots, positions, scale, window, softcap, _ = args
    _cpu.attention_decode(
        q, k, v, kc, vc, layer, slots, positions, scale, window, softcap, per_head
    )
    assert np.array_equal(grouped, per_head)
