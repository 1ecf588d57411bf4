import numpy as np

from inference.engine.sampler import Sampler, apply_top_k, apply_top_p
from inference.engine.types import SamplingParams

LOGITS = np.array([1.0, 5.0, 3.0, 4.9, -2.0], dtype=np.float32)


def test_non_positive_temperature_is_greedy():
    assert Sampler(SamplingParams(temperature=0))(LOGITS) == 1
    assert Sampler(SamplingParams(temperature=-1))(LOGITS) == 1


def test_top_k_one_is_greedy_at_any_temperature():
    s = Sampler(SamplingParams(temperature=5.0, top_k=1, seed=3))
    assert {s(LOGITS) for _ in range(50)} == {1}


def test_top_k_keeps_the_k_largest():
    assert set(apply_top_k(LOGITS, 2)) == {1, 3}
    assert len(apply_top_k(LOGITS, 0)) == len(LOGITS)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    assert apply_top_p(probs, 0.5) == 1
    assert apply_top_p(probs, 0.6) == 2
    assert apply_top_p(probs, 1.0) == 4


def test_a_seed_makes_sampling_reproducible():
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=42)
    s1, s2 = Sampler(params), Sampler(params)
    a = [s1(LOGITS) for _ in range(40)]
    b = [s2(LOGITS) for _ in range(40)]
    assert a == b
    assert len(set(a)) > 1, "temperature 1.5 over close logits must vary"


def test_sampling_stays_inside_top_k():
    s = Sampler(SamplingParams(temperature=2.0, top_k=2, top_p=1.0, seed=0))
    assert {s(LOGITS) for _ in range(200)} == {1, 3}


def test_any_integer_seed_is_reproducible():
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    for seed in (-5, 0, 2**70):
        params = SamplingParams(temperature=1.0, seed=seed)
        first = [Sampler(params)(logits) for _ in range(3)]
        assert len(set(first)) == 1
