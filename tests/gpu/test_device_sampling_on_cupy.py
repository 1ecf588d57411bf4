"""Device sampling (engine/decoding/device_sampling.py) with xp = CuPy against
the host's sample_batch: the same tokens, logprobs within 1e-6 (the device's exp and its
summation order differ from numpy's in the last bits), RNG streams in step; and a step
copies back only its tokens and logprobs, never a (B, V) array.

Run on an H200 (tests/gpu/run-on-device.sh). The cases are the suite's
(tests/engine/decoding/test_device_sampling.py), which runs the same code with xp = numpy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.decoding.device_sampling import pack_mask, sample_batch_on, unpack_mask
from engine.decoding.sampler import Sampler, sample_batch
from engine.decoding.state import DecodeState, choose_rows
from engine.types import SamplingParams
from tests.engine.decoding.test_device_sampling import assert_same, random_params, run_both


@pytest.mark.parametrize("V", [20, 1001, 49152, 151936])
def test_random_batches_sample_on_the_device_as_on_the_host(cp, V):
    seeds = range(40) if V < 10_000 else range(100, 110)
    rows = sum(run_both(cp, cp.asarray, seed, V, tol=1e-6) for seed in seeds)
    assert rows >= 3 * len(seeds)


def test_greedy_ties_go_to_the_lowest_id_on_the_device(cp):
    logits = np.zeros((3, 4099), dtype=np.float32)
    logits[0, [7, 300, 4000]] = 2.0
    logits[1, [4098, 5]] = 1.0
    samplers = [Sampler(SamplingParams(temperature=0.0)) for _ in range(3)]
    got = sample_batch_on(cp, samplers, cp.asarray(logits))
    assert [s.token_id for s in got] == [7, 5, 0]


@pytest.mark.parametrize("V", [9, 49152, 151936])
def test_masks_unpack_on_the_device(cp, V):
    masks = np.random.default_rng(V).random((4, V)) < 0.3
    got = unpack_mask(cp, cp.asarray(pack_mask(masks)), V)
    np.testing.assert_array_equal(cp.asnumpy(got), masks)


def test_a_step_copies_back_only_tokens_and_logprobs(cp, monkeypatch):
    """Every device-to-host copy of sample_batch_on goes through cp.asnumpy (CuPy refuses
    implicit conversions; the suite's Strict array rules out scalar reads): one per step,
    of 2B + 2 x 20 x (rows reporting top_logprobs) numbers at most."""
    copies = []
    real = cp.asnumpy

    def recording(a, *args, **kwargs):
        copies.append(a.size)
        return real(a, *args, **kwargs)

    B, V = 8, 151936
    rng = np.random.default_rng(3)
    params = [random_params(rng, V) for _ in range(B)]
    params[0] = SamplingParams(temperature=0.9, top_p=0.9, seed=1, top_logprobs=20)
    masks = [None] * B
    masks[1] = rng.random(V) < 0.2
    host, device = [Sampler(p) for p in params], [Sampler(p) for p in params]
    logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
    want = sample_batch(host, logits, masks)
    on_device = cp.asarray(logits)
    monkeypatch.setattr(cp, "asnumpy", recording)
    got = sample_batch_on(cp, device, on_device, masks)
    monkeypatch.undo()
    assert_same(got, want, 1e-6)
    assert len(copies) == 1 and copies[0] <= 2 * B + 2 * 20 * B, copies


def test_choose_rows_samples_cupy_logits_on_the_device(cp):
    rng = np.random.default_rng(11)
    V = 4099
    params = [random_params(rng, V) for _ in range(6)]
    params[3] = SamplingParams(temperature=1.0, seed=2, logprobs=True, top_logprobs=2)
    host = [DecodeState(Sampler(p)) for p in params]
    device = [DecodeState(Sampler(p)) for p in params]
    for step in range(5):
        if step == 1:  # a forced token, with its logprob from one row's host copy
            host[3].force([42])
            device[3].force([42])
        logits = (rng.standard_normal((6, V)) * 2).astype(np.float32)
        assert choose_rows(device, cp.asarray(logits)) == choose_rows(host, logits), step
        for h, d in zip(host, device, strict=True):
            assert_same([d.last], [h.last], 1e-6, step)
