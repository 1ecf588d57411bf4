"""Device sampling (issue 16) run with xp = numpy: sample_batch_on gives what the host's
sample_batch gives, row for row, and moves each RNG as it does.

The logits go in as `Strict`, an ndarray subclass that refuses to become a host scalar
(bool, int, float, item, tolist): every array derived from it stays Strict, so a test
passing proves the device code never reads a device value back mid-step, which on CuPy
would be a hidden synchronising copy. tests/gpu/test_device_sampling_on_cupy.py runs the
same cases with xp = CuPy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.decoding import state as state_module
from engine.decoding.device_sampling import pack_mask, sample_batch_on, unpack_mask
from engine.decoding.sampler import Sample, Sampler, apply_top_p, sample_batch
from engine.decoding.state import DecodeState, choose_rows
from engine.types import SamplingParams
from kernels import array_module


class Strict(np.ndarray):
    """An array standing in for device memory: no value of it reaches the host."""

    def _refuse(self, *args):
        raise AssertionError("a device value was read on the host")

    __bool__ = __int__ = __float__ = __index__ = item = tolist = _refuse


def random_params(rng: np.random.Generator, V: int) -> SamplingParams:
    def pick(options):
        return options[rng.integers(len(options))]

    return SamplingParams(
        temperature=pick([0.0, 0.0, 0.5, 1.0, 1.0, 1.7]),
        top_k=pick([0, 0, 0, 1, 5, 40, V - 1, V + 3]),
        top_p=pick([1.0, 1.0, 0.95, 0.9, 0.5, 0.0]),
        min_p=pick([0.0, 0.0, 0.0, 0.05, 0.3, 1.0]),
        repetition_penalty=pick([1.0, 1.0, 1.3, 0.8]),
        presence_penalty=pick([0.0, 0.0, 0.7, -0.5]),
        frequency_penalty=pick([0.0, 0.0, 0.4]),
        logit_bias=pick([(), ((3, 5.0), (V + 7, 1.0)), ((0, -100.0), (V - 1, 100.0))]),
        logprobs=bool(rng.integers(2)),
        top_logprobs=pick([0, 0, 1, 5, 20]),
        seed=int(rng.integers(1 << 31)),
    )


def random_step(rng: np.random.Generator, B: int, V: int):
    """(logits (B, V) float32, masks): normal logits at a random scale, some rows tied
    (rounded), -inf, +inf or NaN; some rows masked, sometimes all, sometimes to one token."""
    logits = (rng.standard_normal((B, V)) * rng.choice([0.5, 2.0, 8.0])).astype(np.float32)
    for i in range(B):
        kind = rng.integers(12)
        if kind == 0:
            logits[i] = np.round(logits[i])  # ties: greedy, top_k and sorting to the lower id
        elif kind == 1:
            logits[i] = -np.inf
        elif kind == 2:
            logits[i, rng.integers(V, size=2)] = np.inf
        elif kind == 3:
            logits[i, rng.integers(V)] = np.nan
        elif kind == 4:
            logits[i, rng.random(V) < 0.5] = -np.inf
    masks = [None] * B
    every = rng.random() < 0.2
    for i in range(B):
        if every or rng.random() < 0.3:
            masks[i] = rng.random(V) < rng.choice([0.001, 0.1, 0.6])
            masks[i][rng.integers(V)] = True
    return logits, masks


def assert_same(got: list[Sample], want: list[Sample], tol: float, where=None) -> None:
    assert [s.token_id for s in got] == [s.token_id for s in want], where
    for g, w in zip(got, want, strict=True):
        assert (g.logprob is None) == (w.logprob is None), where
        if w.logprob is not None:
            assert abs(g.logprob - w.logprob) <= tol, (where, g, w)
        assert [t for t, _ in g.top] == [t for t, _ in w.top], where
        np.testing.assert_allclose([v for _, v in g.top], [v for _, v in w.top], atol=tol)


def run_both(xp, to_device, seed: int, V: int, steps: int = 3, tol: float = 1e-9) -> int:
    """A random batch sampled `steps` times on the host and with sample_batch_on(xp),
    accepting the tokens in between; returns how many rows were compared."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 9))
    params = [random_params(rng, V) for _ in range(B)]
    host, device = [Sampler(p) for p in params], [Sampler(p) for p in params]
    for step in range(steps):
        logits, masks = random_step(rng, B, V)
        want = sample_batch(host, logits, masks)
        got = sample_batch_on(xp, device, to_device(logits), masks)
        assert_same(got, want, tol, (seed, V, step))
        for h, d, s in zip(host, device, want, strict=True):
            h.accept(s.token_id)
            d.accept(s.token_id)
    assert [d.rng.bit_generator.state for d in device] == [h.rng.bit_generator.state for h in host]
    return B * steps


def strict(logits: np.ndarray) -> Strict:
    return logits.view(Strict)


@pytest.mark.parametrize("V", [5, 20, 300, 1001])
def test_small_vocabularies_sample_as_the_host(V):
    rows = sum(run_both(np, strict, seed, V) for seed in range(60))
    assert rows > 60 * 3


def test_a_49k_vocabulary_samples_as_the_host():
    rows = sum(run_both(np, strict, seed, 49152) for seed in range(100, 125))
    assert rows > 25 * 3


def test_each_kind_of_row_on_its_own():
    """Configurations named one by one, so that none depends on the random mix."""
    V = 4099
    rng = np.random.default_rng(7)
    for kw in [
        dict(temperature=0.0),
        dict(temperature=0.0, logprobs=True, top_logprobs=20),
        dict(temperature=1.0, top_k=0, top_p=1.0, logprobs=True),
        dict(temperature=0.8, top_k=40),
        dict(temperature=0.8, top_k=1),
        dict(temperature=1.2, top_k=0, top_p=0.9),
        dict(temperature=1.2, top_k=0, top_p=1.0, min_p=0.05),
        dict(temperature=1.2, top_k=50, top_p=0.8, min_p=0.02, top_logprobs=5),
        dict(temperature=1.0, repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=2),
        dict(temperature=1.0, logit_bias=((5, 100.0), (V, 100.0), (10**9, -3.0))),
    ]:
        params = SamplingParams(**{"seed": 3, **kw})
        host, device = [Sampler(params) for _ in range(3)], [Sampler(params) for _ in range(3)]
        for step in range(20):
            logits = (rng.standard_normal((3, V)) * 3).astype(np.float32)
            want = sample_batch(host, logits)
            assert_same(sample_batch_on(np, device, strict(logits)), want, 1e-9, (kw, step))
            for h, d, s in zip(host, device, want, strict=True):
                h.accept(s.token_id)
                d.accept(s.token_id)


def test_a_row_without_usable_logits_samples_as_the_host():
    V = 64
    logits = np.zeros((4, V), dtype=np.float32)
    logits[0] = -np.inf
    logits[1, [3, 9]] = np.inf
    logits[2, 5] = np.nan
    logits[3] = -np.inf
    mask = np.zeros(V, dtype=bool)
    mask[[7, 8, 40]] = True
    masks = [None, None, mask, mask]
    p = SamplingParams(temperature=1.0, seed=1, logprobs=True, top_logprobs=4)
    host, device = [Sampler(p) for _ in range(4)], [Sampler(p) for _ in range(4)]
    for _ in range(30):
        want = sample_batch(host, logits, masks)
        assert_same(sample_batch_on(np, device, strict(logits), masks), want, 1e-12)
        assert {s.token_id for s in want[2:]} <= {7, 8, 40} and want[1].token_id in (3, 9)


def test_a_ban_on_an_id_the_model_gave_plus_inf_holds_as_on_the_host():
    # +inf + a ban's -inf would be NaN, a row "without usable logits" sharing its mass
    # among every id, the banned one too.
    V = 16
    logits = np.zeros((2, V), dtype=np.float32)
    logits[:, 4] = np.inf
    logits[1, 9] = np.inf
    p = SamplingParams(temperature=1.0, seed=3, logit_bias=((4, -math.inf), (2, 1.5)))
    host, device = [Sampler(p) for _ in range(2)], [Sampler(p) for _ in range(2)]
    for _ in range(30):
        want = sample_batch(host, logits)
        assert_same(sample_batch_on(np, device, strict(logits)), want, 1e-12)
        assert want[0].token_id != 4 and want[1].token_id == 9


class ScanInBlocks:
    """numpy, except that cumsum adds in blocks, then the blocks' totals, as a device's
    parallel scan does: the last bits of a running sum differ from numpy's."""

    asnumpy = staticmethod(np.asarray)  # as CuPy's: the one copy back

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def cumsum(a, axis):
        assert axis == 1
        out, offset = np.empty_like(a), np.zeros(a.shape[0], dtype=a.dtype)
        for j in range(0, a.shape[1], 4):
            block = np.cumsum(a[:, j : j + 4], axis=1)
            out[:, j : j + 4] = block + offset[:, None]
            offset = offset + block[:, -1]
        return out


@pytest.mark.parametrize("V", [20, 4096])
def test_a_nucleus_reaching_top_p_exactly_does_not_hinge_on_the_sums_order(V):
    """A uniform row (every logit -inf) with top_p 0.5: half the tokens reach p exactly,
    and numpy's running sum lands a bit under 0.5 where a blocked one lands on it. Both
    take the same nucleus (sampler.TOP_P_SLACK), so both draw the same tokens."""
    assert apply_top_p(np.full(V, 1.0 / V), 0.5) == V // 2
    logits = np.full((2, V), -np.inf, dtype=np.float32)
    p = SamplingParams(temperature=1.7, top_p=0.5, seed=5, logprobs=True)
    host, device = [Sampler(p) for _ in range(2)], [Sampler(p) for _ in range(2)]
    for _ in range(40):
        want = sample_batch(host, logits, None)
        assert_same(sample_batch_on(ScanInBlocks(), device, logits, None), want, 1e-12)
        assert all(s.token_id < V // 2 for s in want)


def test_a_mask_allowing_nothing_raises_before_any_rng_moves():
    samplers = [Sampler(SamplingParams(temperature=1.0, seed=i)) for i in range(3)]
    before = [s.rng.bit_generator.state for s in samplers]
    logits = strict(np.zeros((3, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="allows no token"):
        sample_batch_on(np, samplers, logits, [None, np.ones(5, bool), np.zeros(5, bool)])
    assert [s.rng.bit_generator.state for s in samplers] == before
    with pytest.raises(ValueError):
        sample_batch_on(np, samplers, logits[:2])
    assert sample_batch_on(np, [], strict(np.zeros((0, 5), dtype=np.float32))) == []


def test_greedy_rows_draw_nothing_and_drawing_rows_one_uniform_each():
    greedy = Sampler(SamplingParams(temperature=0.0, seed=1))
    drawing = Sampler(SamplingParams(temperature=1.0, top_k=1, seed=1))
    twin = np.random.default_rng(1)
    logits = strict(np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32))
    for _ in range(3):
        sample_batch_on(np, [greedy, drawing], logits)
        twin.random()
    assert greedy.rng.bit_generator.state == np.random.default_rng(1).bit_generator.state
    assert drawing.rng.bit_generator.state == twin.bit_generator.state


@pytest.mark.parametrize("V", [1, 7, 8, 9, 49152, 151936])
def test_masks_travel_as_bits(V):
    masks = np.random.default_rng(V).random((3, V)) < 0.4
    bits = pack_mask(masks)
    assert bits.dtype == np.uint8 and bits.shape == (3, (V + 7) // 8)
    np.testing.assert_array_equal(unpack_mask(np, bits, V), masks)


def test_the_array_module_of_numpy_arrays_is_numpy():
    assert array_module(np.zeros(3)) is np
    assert array_module(strict(np.zeros(3))) is np


def test_choose_rows_samples_device_logits_where_they_lie(monkeypatch):
    """A non-ndarray-typed batch takes the device path (spied on, not replaced) and
    chooses what the host path chooses, a forced token with its logprob included."""
    calls = []

    def spy(xp, samplers, logits, masks=None):
        calls.append((xp, type(logits), len(samplers)))
        return sample_batch_on(xp, samplers, logits, masks)

    monkeypatch.setattr(state_module, "sample_batch_on", spy)
    rng = np.random.default_rng(5)
    V = 300
    params = [random_params(rng, V) for _ in range(5)]
    params[2] = SamplingParams(temperature=1.0, seed=9, logprobs=True, top_logprobs=3)
    host = [DecodeState(Sampler(p)) for p in params]
    device = [DecodeState(Sampler(p)) for p in params]
    for step in range(6):
        if step == 2:  # a forced token on row 2, as when a think budget runs out
            host[2].force([17])
            device[2].force([17])
        logits = (rng.standard_normal((5, V)) * 2).astype(np.float32)
        want = choose_rows(host, logits)
        got = choose_rows(device, strict(logits))
        assert got == want, step
        for h, d in zip(host, device, strict=True):
            assert_same([d.last], [h.last], 1e-9, step)
            assert d.last_forced == h.last_forced
    assert device[2].last_forced is False and host[2].last_forced is False
    assert len(calls) == 6 and all(c[0] is np and c[1] is Strict for c in calls)
    assert calls[2][2] == 4  # the forced row was not sampled


def test_choose_rows_keeps_numpy_logits_on_the_host_path(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("numpy logits went to the device path")

    monkeypatch.setattr(state_module, "sample_batch_on", refuse)
    states = [DecodeState(Sampler(SamplingParams(temperature=0.0))) for _ in range(2)]
    logits = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]], dtype=np.float32)
    assert choose_rows(states, logits) == [1, 0]
