"""The KV cache's narrow types (the `kv_dtype` load option, kernels/kv_types.py): the
compiled attention reads float16 and Q8_0 rows directly and agrees with the numpy
reference over the same stored rows (which both write bit for bit alike), every row of a
decode batch is computed as alone, and the memory per position scales with the type."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import kv_types
from kernels.kv_cache import KVCache
from kernels.reference.backend import NumpyBackend
from kernels.xp.backend import XpBackend

NARROW = ("f16", "q8_0")
L, SLOTS, HKV, H, N_CTX = 2, 3, 2, 6, 160


@pytest.fixture(scope="module")
def cpu():
    from kernels.cpu.backend import CpuBackend

    try:
        return CpuBackend()
    except ValueError as exc:
        pytest.skip(str(exc))


def qkv(rng, rows, Dh):
    return (
        rng.standard_normal((rows, H, Dh)).astype(np.float32),
        rng.standard_normal((rows, HKV, Dh)).astype(np.float32),
        rng.standard_normal((rows, HKV, Dh)).astype(np.float32),
    )


def test_encode_then_decode_stays_within_the_type_s_rounding():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 7, 64)).astype(np.float32) * 3
    f16 = kv_types.decode(np, kv_types.encode(np, x, "f16"), "f16")
    assert np.abs(f16 - x).max() <= np.abs(x).max() * 2.0**-11
    stored = kv_types.encode(np, x, "q8_0")
    assert stored.dtype == np.uint8 and stored.shape == (5, 7, 2 * 34)
    q8 = kv_types.decode(np, stored, "q8_0")
    amax = np.abs(x.reshape(5, 7, 2, 32)).max(axis=-1, keepdims=True)
    # Half a quantisation step (amax / 127 / 2), plus the f16 rounding of the scale.
    bound = amax / 127 * (0.5 + 127 * 2.0**-11)
    assert (np.abs(q8 - x).reshape(5, 7, 2, 32) <= bound * 1.0001).all()
    assert kv_types.encode(np, x, "f32") is x  # f32: stored as it is


def test_a_zero_block_stays_zero():
    x = np.zeros((1, 64), dtype=np.float32)
    assert not kv_types.decode(np, kv_types.encode(np, x, "q8_0"), "q8_0").any()


@pytest.mark.parametrize("kv_dtype", NARROW)
@pytest.mark.parametrize("Dh", [64, 128])
@pytest.mark.parametrize("window", [0, 40])
def test_compiled_attention_reads_narrow_rows_like_the_reference(cpu, kv_dtype, Dh, window):
    rng = np.random.default_rng(Dh + window)
    ref = NumpyBackend()
    kc = cpu.make_kv_cache(L, SLOTS, HKV, N_CTX, Dh, kv_dtype)
    kr = ref.make_kv_cache(L, SLOTS, HKV, N_CTX, Dh, kv_dtype)
    assert kc.k.dtype == kv_types.storage(kv_dtype, Dh)[0]
    q, k, v = qkv(rng, 100, Dh)  # a prompt chunk: the blocked prefill kernel
    ours = cpu.attention_prefill(q, k, v, kc, 1, 2, 0, 0.125, window)
    theirs = ref.attention_prefill(q, k, v, kr, 1, 2, 0, 0.125, window)
    assert np.array_equal(kc.k, kr.k) and np.array_equal(kc.v, kr.v)  # the same bytes
    np.testing.assert_allclose(ours, theirs, atol=5e-6)
    q, k, v = qkv(rng, 3, Dh)  # a decode step over three slots
    slots, positions = [2, 0, 1], np.array([100, 7, 0])
    ours = cpu.attention_decode(q, k, v, kc, 1, slots, positions, 0.125, window)
    theirs = ref.attention_decode(q, k, v, kr, 1, slots, positions, 0.125, window)
    assert np.array_equal(kc.k, kr.k) and np.array_equal(kc.v, kr.v)
    np.testing.assert_allclose(ours, theirs, atol=5e-6)


@pytest.mark.parametrize("kv_dtype", kv_types.KV_DTYPES)
def test_a_decode_row_is_the_same_bits_alone_or_in_a_batch(cpu, kv_dtype):
    rng = np.random.default_rng(7)
    Dh = 64
    kv = cpu.make_kv_cache(L, SLOTS, HKV, N_CTX, Dh, kv_dtype)
    for slot in range(SLOTS):
        q, k, v = qkv(rng, 120, Dh)
        cpu.attention_prefill(q, k, v, kv, 0, slot, 0, 0.125)
    q, k, v = qkv(rng, 3, Dh)
    slots, positions = [0, 1, 2], np.array([120, 120, 120])
    together = cpu.attention_decode(q, k, v, kv, 0, slots, positions, 0.125)
    for b in range(3):
        alone = cpu.attention_decode(
            q[b : b + 1],
            k[b : b + 1],
            v[b : b + 1],
            kv,
            0,
            slots[b : b + 1],
            positions[b : b + 1],
            0.125,
        )
        assert np.array_equal(alone[0], together[b]), (kv_dtype, b)


@pytest.mark.parametrize("kv_dtype", NARROW)
def test_the_xp_backend_stores_and_reads_the_narrow_types_like_the_reference(kv_dtype):
    rng = np.random.default_rng(3)
    xp, ref = XpBackend(np), NumpyBackend()
    kx = xp.make_kv_cache(L, SLOTS, HKV, N_CTX, 64, kv_dtype)
    kr = ref.make_kv_cache(L, SLOTS, HKV, N_CTX, 64, kv_dtype)
    q, k, v = qkv(rng, 30, 64)
    a = xp.attention_prefill(q, k, v, kx, 0, 1, 0, 0.125)
    b = ref.attention_prefill(q, k, v, kr, 0, 1, 0, 0.125)
    assert np.array_equal(kx.k, kr.k) and np.array_equal(a, b)
    assert kx.bytes_per_token() == kr.bytes_per_token()
    saved = kx.save(1, 30)
    assert saved[0].dtype == kx.k.dtype and saved[0].shape[-1] == kx.k.shape[-1]


def test_bytes_per_position_scale_with_the_type():
    per = {t: KVCache(2, 1, 2, 8, 64, kv_dtype=t).bytes_per_token() for t in kv_types.KV_DTYPES}
    assert per["f32"] == 2 * 2 * 2 * 64 * 4
    assert per["f32"] / per["f16"] == 2
    assert per["f32"] / per["q8_0"] == pytest.approx(128 / 34)  # ~3.76


def test_a_q8_0_cache_needs_heads_of_whole_blocks_and_a_known_type():
    with pytest.raises(ValueError, match="multiple of 32"):
        KVCache(1, 1, 1, 8, 48, kv_dtype="q8_0")
    with pytest.raises(ValueError, match="not one of f32, f16, q8_0"):
        KVCache(1, 1, 1, 8, 64, kv_dtype="int4")


def test_the_kernels_refuse_caches_of_two_types_or_the_wrong_row(cpu):
    Dh = 64
    q, k, v = qkv(np.random.default_rng(0), 1, Dh)
    out = np.empty((1, H * Dh), dtype=np.float32)
    f16 = np.zeros((1, 1, HKV, 8, Dh), dtype=np.float16)
    f32 = np.zeros((1, 1, HKV, 8, Dh), dtype=np.float32)
    with pytest.raises(ValueError, match="vcache must have kcache's type"):
        cpu.ext.attention_prefill(q, k, v, f16, f32, 0, 0, 0, 0.125, 0, 0.0, out)
    wrong = np.zeros((1, 1, HKV, 8, 2 * Dh), dtype=np.uint8)  # not Dh / 32 * 34 bytes
    with pytest.raises(ValueError, match="Q8_0 blocks"):
        cpu.ext.attention_prefill(q, k, v, wrong, wrong.copy(), 0, 0, 0, 0.125, 0, 0.0, out)
