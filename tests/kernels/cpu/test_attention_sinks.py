"""Attention sinks (gpt-oss) in the compiled attention: a logit per query head joins each
softmax's denominator and takes no value. Prefill and decode, every KV type, windows,
head sizes the AVX-512 attention takes (Dh 64, where the CPU has it) and ones it does not
(Dh 24: the portable loops): within float32 rounding of the numpy reference
(kernels/reference/backend.py), a decode row the same bits alone or batched, and no
sinks leaves the old bits."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import kv_types
from kernels.reference.backend import NumpyBackend

L, SLOTS = 2, 3


@pytest.fixture(scope="module")
def cpu():
    from kernels.cpu.backend import CpuBackend

    try:
        return CpuBackend()
    except ValueError as exc:
        pytest.skip(str(exc))


def qkv(rng, rows, H, Hkv, Dh):
    return (
        rng.standard_normal((rows, H, Dh)).astype(np.float32),
        rng.standard_normal((rows, Hkv, Dh)).astype(np.float32),
        rng.standard_normal((rows, Hkv, Dh)).astype(np.float32),
    )


@pytest.mark.parametrize("kv_dtype", kv_types.KV_DTYPES)
@pytest.mark.parametrize(("H", "Hkv", "Dh"), [(6, 2, 64), (4, 2, 24)])
@pytest.mark.parametrize("window", [0, 8])
def test_sinks_match_the_reference(cpu, kv_dtype, H, Hkv, Dh, window):
    if kv_dtype == "q8_0" and Dh % 32:
        pytest.skip("Q8_0 rows are whole blocks of 32")
    rng = np.random.default_rng(Dh + window)
    sinks = (2.0 * rng.standard_normal(H)).astype(np.float32)
    ref = NumpyBackend()
    kc = cpu.make_kv_cache(L, SLOTS, Hkv, 64, Dh, kv_dtype)
    kr = ref.make_kv_cache(L, SLOTS, Hkv, 64, Dh, kv_dtype)
    scale = Dh**-0.5
    q, k, v = qkv(rng, 40, H, Hkv, Dh)  # a prompt chunk: the blocked prefill kernel
    ours = cpu.attention_prefill(q, k, v, kc, 1, 2, 0, scale, window, 0.0, sinks)
    theirs = ref.attention_prefill(q, k, v, kr, 1, 2, 0, scale, window, 0.0, sinks)
    np.testing.assert_allclose(ours, theirs, atol=5e-6)
    plain = ref.attention_prefill(q, k, v, kr, 1, 2, 0, scale, window)
    assert np.abs(plain - theirs).max() > 1e-2  # the sinks matter here
    q, k, v = qkv(rng, 3, H, Hkv, Dh)  # a decode step over three slots
    slots, positions = [2, 0, 1], np.array([40, 7, 0])
    ours = cpu.attention_decode(q, k, v, kc, 1, slots, positions, scale, window, 0.0, sinks)
    theirs = ref.attention_decode(q, k, v, kr, 1, slots, positions, scale, window, 0.0, sinks)
    np.testing.assert_allclose(ours, theirs, atol=5e-6)
    for b in range(3):  # each row alone: the same bits
        one = slice(b, b + 1)
        alone = cpu.attention_decode(
            q[one], k[one], v[one], kc, 1, slots[one], positions[one], scale, window, 0.0, sinks
        )
        assert np.array_equal(alone[0], ours[b]), b


def test_a_dominant_sink_takes_the_weight_and_gives_no_value(cpu):
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 5, 4, 2, 32)
    kv = cpu.make_kv_cache(1, 1, 2, 8, 32)
    sinks = np.array([60.0, 60.0, -60.0, -60.0], dtype=np.float32)
    out = cpu.attention_prefill(q, k, v, kv, 0, 0, 0, 32**-0.5, 0, 0.0, sinks).reshape(5, 4, 32)
    assert np.abs(out[:, :2]).max() < 1e-12  # heads 0, 1: all weight on the sink
    kv2 = cpu.make_kv_cache(1, 1, 2, 8, 32)
    plain = cpu.attention_prefill(q, k, v, kv2, 0, 0, 0, 32**-0.5).reshape(5, 4, 32)
    np.testing.assert_allclose(out[:, 2:], plain[:, 2:], rtol=1e-6, atol=1e-7)


def test_without_sinks_the_kernels_give_the_bits_they_gave(cpu):
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, 30, 6, 2, 64)
    a, b = (cpu.make_kv_cache(1, 1, 2, 32, 64) for _ in range(2))
    ext = cpu.ext
    args = (q, k, v, a.k, a.v, 0, 0, 0, 0.125, 0, 0.0)
    old, new = np.empty((30, 384), np.float32), np.empty((30, 384), np.float32)
    ext.attention_prefill(*args, old)
    ext.attention_prefill(q, k, v, b.k, b.v, 0, 0, 0, 0.125, 0, 0.0, new, sinks=None)
    assert np.array_equal(old, new)
    with pytest.raises(ValueError, match="sinks"):
        ext.attention_prefill(*args, new, sinks=np.zeros(5, np.float32))
