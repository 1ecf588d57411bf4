import math

import numpy as np
import pytest

from engine.decoding.sampler import (
    MAX_TOP_LOGPROBS,
    Sample,
    Sampler,
    _pick,
    _sample_rows,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    sample_batch,
)
from engine.types import SamplingParams

LOGITS = np.array([1.0, 5.0, 3.0, 4.9, -2.0], dtype=np.float32)
# Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
QUARTET = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
HOT = dict(temperature=1.0, top_k=0, top_p=1.0)


def params(**kw) -> SamplingParams:
    return SamplingParams(**{**HOT, "seed": 0, **kw})


def support(sampler: Sampler, logits, n: int = 400, mask=None) -> set[int]:
    return {sampler.sample(logits, mask).token_id for _ in range(n)}


def log_softmax(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def all_logprobs(sampler: Sampler, logits) -> np.ndarray:
    """Every token's reported logprob, through `top` (V <= 20)."""
    top = dict(sampler.sample(logits).top)
    return np.array([top.get(i, -np.inf) for i in range(len(logits))])


# --- greedy and temperature ------------------------------------------------------------


def test_non_positive_temperature_is_greedy():
    assert Sampler(SamplingParams(temperature=0))(LOGITS) == 1
    assert Sampler(SamplingParams(temperature=-1))(LOGITS) == 1


def test_greedy_ties_go_to_the_lowest_id():
    logits = np.array([0.0, 2.0, 1.0, 2.0, 2.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0))
    assert {s.sample(logits).token_id for _ in range(5)} == {1}


@pytest.mark.parametrize("seed", range(40))
def test_plain_greedy_shortcut_is_the_full_paths_token(seed):
    """sample_batch takes the raw row's argmax for plain greedy rows; the full path (every
    transform in float64) picks the same token, ties and non-finite rows included."""
    rng = np.random.default_rng(seed)
    rows = rng.choice([-1.0, 0.0, 1.0, 2.0], size=(6, 9)).astype(np.float32)  # ties
    rows[1, rng.integers(9)] = np.inf
    rows[2, rng.integers(9)] = np.nan
    rows[3] = -np.inf
    rows[4, :3] = np.inf
    rows[5] = rng.standard_normal(9).astype(np.float32) * 1e30
    samplers = [Sampler(SamplingParams(temperature=0)) for _ in rows]
    assert all(s.plain_greedy for s in samplers)
    assert sample_batch(samplers, rows) == _sample_rows(samplers, rows, [None] * len(rows))


@pytest.mark.parametrize("seed", range(40))
def test_greedy_with_banned_tokens_takes_the_shortcut_and_the_full_paths_token(seed):
    """ignore_eos bans the end-of-turn tokens (a bias of -inf): still plain greedy, and the
    shortcut's token is the full path's, a banned argmax (ties included) among them."""
    rng = np.random.default_rng(seed)
    rows = rng.choice([-1.0, 0.0, 1.0, 2.0], size=(6, 9)).astype(np.float32)
    rows[1, rng.integers(9)] = np.inf
    rows[2] = -np.inf
    rows[2, 3] = 1.0  # only a banned token is finite
    banned = ((3, -np.inf), (int(rng.integers(9)), -np.inf))
    samplers = [Sampler(SamplingParams(temperature=0, logit_bias=banned)) for _ in rows]
    assert all(s.plain_greedy for s in samplers)
    picked = sample_batch(samplers, rows)
    assert picked == _sample_rows(samplers, rows, [None] * len(rows))
    assert picked[0].token_id not in {3, banned[1][0]}  # an ordinary row: never a banned one
    # A finite bias still moves logits: the full path.
    assert not Sampler(SamplingParams(temperature=0, logit_bias=((1, 5.0),))).plain_greedy


def test_a_ban_holds_where_the_model_gave_the_banned_id_plus_inf():
    # Added, the ban's -inf and the logit's +inf made NaN: greedy then took id 0 and a
    # draw could take the banned id. Set, the ban leaves the largest allowed logit.
    row = np.array([0.0, 1.0, np.inf, 0.5], dtype=np.float32)
    ban = ((2, -math.inf),)
    assert Sampler(SamplingParams(temperature=0, logit_bias=ban)).sample(row).token_id == 1
    full = Sampler(SamplingParams(temperature=0, logprobs=True, logit_bias=ban))
    assert full.sample(row).token_id == 1
    drawn = Sampler(SamplingParams(temperature=0.7, seed=1, logit_bias=ban))
    assert 2 not in {drawn.sample(row).token_id for _ in range(200)}


def test_greedy_draws_nothing_from_the_rng():
    s = Sampler(SamplingParams(temperature=0, seed=1))
    before = s.rng.bit_generator.state
    s.sample(LOGITS)
    assert s.rng.bit_generator.state == before


def test_top_k_one_is_greedy_at_any_temperature():
    s = Sampler(SamplingParams(temperature=5.0, top_k=1, seed=3))
    assert {s(LOGITS) for _ in range(50)} == {1}


def test_sampled_frequencies_follow_the_distribution():
    s = Sampler(params(seed=11))
    counts = np.bincount([s.sample(QUARTET).token_id for _ in range(20000)], minlength=4)
    np.testing.assert_allclose(counts / 20000, [0.5, 0.3, 0.15, 0.05], atol=0.015)


def test_temperature_sharpens_and_flattens():
    cold = Sampler(params(temperature=0.25, seed=2))
    hot = Sampler(params(temperature=4.0, seed=2))
    cold_share = np.mean([cold.sample(QUARTET).token_id == 0 for _ in range(2000)])
    hot_share = np.mean([hot.sample(QUARTET).token_id == 0 for _ in range(2000)])
    p = np.array([0.5, 0.3, 0.15, 0.05])
    assert cold_share == pytest.approx(p[0] ** 4 / (p**4).sum(), abs=0.03)  # 0.88
    assert hot_share == pytest.approx(p[0] ** 0.25 / (p**0.25).sum(), abs=0.03)  # 0.31


# --- logit_bias -------------------------------------------------------------------------


def test_logit_bias_minus_100_removes_the_winner():
    s = Sampler(SamplingParams(temperature=0, logit_bias=((1, -100.0),)))
    assert s.sample(LOGITS).token_id == 3


def test_logit_bias_plus_100_forces_a_token():
    s = Sampler(params(logit_bias=((4, 100.0),)))
    assert support(s, LOGITS, 200) == {4}


def test_logit_bias_ignores_ids_outside_the_vocabulary_and_nan():
    bias = ((-1, 100.0), (5, 100.0), (10**30, 100.0), (2, float("nan")), (4, 1.0))
    s = Sampler(SamplingParams(temperature=0, logprobs=True, top_logprobs=5, logit_bias=bias))
    expected = log_softmax(LOGITS + np.array([0, 0, 0, 0, 1.0]))
    np.testing.assert_allclose(all_logprobs(s, LOGITS), expected, rtol=1e-12)


def test_a_minus_infinity_bias_bans_a_token_even_when_it_is_all_there_is():
    """-inf is what ignore_eos puts on the end tokens (clients' biases are clamped to -100
    at the HTTP edge): the token is never drawn, greedy or sampled, whatever its logit."""
    logits = np.array([0.0, 50.0, 1.0], dtype=np.float32)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, seed=3, logit_bias=((1, -math.inf),))
        sampler = Sampler(params)
        assert all(sampler.sample(logits).token_id != 1 for _ in range(50))
    clamped = Sampler(SamplingParams(temperature=0.0, logit_bias=((1, -1e9),)))
    assert clamped.bias_values.tolist() == [-100.0]


def test_logit_bias_is_clamped_to_100():
    s = Sampler(params(top_logprobs=8, logit_bias=((2, 1e9), (3, -1e9))))
    lp = all_logprobs(s, np.zeros(8, dtype=np.float32))
    assert lp[2] - lp[0] == pytest.approx(100.0, abs=1e-9)
    assert lp[3] - lp[0] == pytest.approx(-100.0, abs=1e-9)


# --- penalties --------------------------------------------------------------------------


def test_presence_and_frequency_penalties_subtract_the_exact_amounts():
    s = Sampler(params(presence_penalty=0.5, frequency_penalty=0.25, top_logprobs=8))
    for t in (2, 2, 5, 2):
        s.accept(t)
    logits = np.zeros(8, dtype=np.float32)
    expected = log_softmax([0, 0, -0.5 - 3 * 0.25, 0, 0, -0.5 - 0.25, 0, 0])
    np.testing.assert_allclose(all_logprobs(s, logits), expected, rtol=1e-12)


def test_negative_penalties_encourage_repeats():
    s = Sampler(params(presence_penalty=-1.0, frequency_penalty=-0.5, top_logprobs=4))
    s.accept(3)
    expected = log_softmax([0, 0, 0, 1.5])
    np.testing.assert_allclose(all_logprobs(s, np.zeros(4, np.float32)), expected, rtol=1e-12)


def test_penalties_are_clamped_to_two():
    s = Sampler(params(presence_penalty=1e9, frequency_penalty=-1e9, top_logprobs=4))
    s.accept(1)
    expected = log_softmax([0, -2.0 + 2.0, 0, 0])
    np.testing.assert_allclose(all_logprobs(s, np.zeros(4, np.float32)), expected, rtol=1e-12)
    s = Sampler(params(presence_penalty=1e9, top_logprobs=4))
    s.accept(1)
    np.testing.assert_allclose(
        all_logprobs(s, np.zeros(4, np.float32)), log_softmax([0, -2.0, 0, 0]), rtol=1e-12
    )


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.0, 0.5], dtype=np.float32)
    s = Sampler(params(repetition_penalty=2.0, top_logprobs=5))
    for t in (0, 1, 3, 0):  # a repeat is penalised once, not per occurrence
        s.accept(t)
    expected = log_softmax([1.0, -4.0, 1.0, 0.0, 0.5])
    np.testing.assert_allclose(all_logprobs(s, logits), expected, rtol=1e-12)


def test_repetition_penalty_below_one_favours_repeats():
    logits = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    s = Sampler(params(repetition_penalty=0.5, top_logprobs=3))
    s.accept(0)
    s.accept(1)
    expected = log_softmax([4.0, -1.0, 1.0])
    np.testing.assert_allclose(all_logprobs(s, logits), expected, rtol=1e-12)


def test_penalties_count_only_accepted_tokens():
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=2.0))
    logits = np.array([1.0, 0.9, 0.0], dtype=np.float32)
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 0, 0]
    s.accept(0)
    assert s.sample(logits).token_id == 1


def test_the_call_path_accepts_each_token():
    s = Sampler(SamplingParams(temperature=0, frequency_penalty=2.0))
    logits = np.array([1.0, 0.9, 0.0], dtype=np.float32)
    # 0; then 0 is at -1 so 1; then 1 is at -1.1 so 2 (0); then 2 is at -2 so 0 (-1).
    assert [s(logits) for _ in range(4)] == [0, 1, 2, 0]
    assert isinstance(s(logits), int)


def test_penalties_ignore_generated_ids_outside_the_vocabulary():
    s = Sampler(SamplingParams(temperature=0, presence_penalty=2.0))
    s.accept(10_000)
    s.accept(-3)
    assert s.sample(LOGITS).token_id == 1


# --- truncation -------------------------------------------------------------------------


def test_top_k_keeps_the_k_largest():
    assert set(apply_top_k(LOGITS, 2)) == {1, 3}
    assert len(apply_top_k(LOGITS, 0)) == len(LOGITS)


@pytest.mark.parametrize("seed", range(6))
def test_apply_top_k_is_a_stable_descending_sort_prefix(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(50, 3000))
    values = rng.integers(-6, 6, size=V).astype(np.float64)  # many ties
    values[rng.random(V) < 0.3 * (seed % 3)] = -np.inf
    order = np.argsort(-values, kind="stable")
    for k in (1, 2, 7, 40, V // 2, V - 1, V):
        assert np.array_equal(apply_top_k(values, k), order[:k]), k


def test_sampling_stays_inside_top_k():
    s = Sampler(SamplingParams(temperature=2.0, top_k=2, top_p=1.0, seed=0))
    assert {s(LOGITS) for _ in range(200)} == {1, 3}


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    assert apply_top_p(probs, 0.5) == 1
    assert apply_top_p(probs, 0.6) == 2
    assert apply_top_p(probs, 1.0) == 4


@pytest.mark.parametrize(
    "top_p, kept", [(0.0, {0}), (0.45, {0}), (0.79, {0, 1}), (0.81, {0, 1, 2}), (1.0, {0, 1, 2, 3})]
)
def test_sampling_stays_inside_the_top_p_nucleus(top_p, kept):
    assert support(Sampler(params(top_p=top_p)), QUARTET, 600) == kept


def test_top_p_applies_to_the_distribution_left_by_top_k():
    # Over the top 2 (0.5, 0.3) renormalised: 0.625, 0.375; p=0.6 keeps only the first.
    assert support(Sampler(params(top_k=2, top_p=0.6)), QUARTET) == {0}
    assert support(Sampler(params(top_k=2, top_p=0.7)), QUARTET) == {0, 1}


@pytest.mark.parametrize(
    "min_p, kept", [(0.05, {0, 1, 2, 3}), (0.25, {0, 1, 2}), (0.5, {0, 1}), (0.7, {0}), (1.0, {0})]
)
def test_sampling_drops_tokens_under_min_p_of_the_top(min_p, kept):
    assert support(Sampler(params(min_p=min_p)), QUARTET, 600) == kept
    assert support(Sampler(params(min_p=min_p, top_k=3)), QUARTET, 600) == kept - {3}


def test_min_p_counts_against_the_largest_weight():
    assert apply_min_p(np.array([0.5, 0.3, 0.15, 0.05]), 0.3) == 3
    assert apply_min_p(np.array([5.0, 3.0, 1.5, 0.5]), 0.3) == 3
    assert apply_min_p(np.array([0.5, 0.3]), 0.0) == 2


def test_top_p_and_min_p_together_keep_the_shorter_prefix():
    assert support(Sampler(params(top_p=0.81, min_p=0.5)), QUARTET) == {0, 1}
    assert support(Sampler(params(top_p=0.79, min_p=0.2)), QUARTET) == {0, 1}


def test_a_large_vocabulary_without_top_k_samples_the_right_frequencies():
    V = 5000  # several blocks of the two-level draw
    logits = np.full(V, -np.inf, dtype=np.float32)
    logits[[3, 1500, 4999]] = np.log([0.2, 0.5, 0.3])
    s = Sampler(params(seed=4))
    counts = np.bincount([s.sample(logits).token_id for _ in range(6000)], minlength=V)
    assert set(np.flatnonzero(counts)) == {3, 1500, 4999}
    np.testing.assert_allclose(counts[[3, 1500, 4999]] / 6000, [0.2, 0.5, 0.3], atol=0.03)


@pytest.mark.parametrize("n", [7, 256, 257, 5000])
def test_the_draw_never_lands_on_a_zero_weight(n):
    weights = np.zeros(n)
    weights[1 : n - 1 : 3] = 1.0
    for u in (0.0, 1e-300, 0.5, float(np.nextafter(1.0, 0.0))):
        assert weights[_pick(weights.copy(), u)] > 0, u


# --- mask -------------------------------------------------------------------------------


def test_a_masked_token_is_never_drawn_greedy():
    mask = np.array([True, False, True, True, True])
    assert Sampler(SamplingParams(temperature=0)).sample(LOGITS, mask).token_id == 3


@pytest.mark.parametrize("top_k", [0, 2, 4])
def test_a_masked_token_is_never_sampled(top_k):
    mask = np.array([True, False, False, True, True])
    s = Sampler(params(temperature=3.0, top_k=top_k))
    expected = {3, 0} if top_k == 2 else {0, 3, 4}
    assert support(s, LOGITS, 600, mask) == expected


def test_a_mask_allowing_nothing_is_a_value_error():
    s = Sampler(params())
    with pytest.raises(ValueError):
        s.sample(LOGITS, np.zeros(5, dtype=bool))
    with pytest.raises(ValueError):
        s.sample(LOGITS, np.ones(4, dtype=bool))


def test_a_mask_over_only_impossible_tokens_falls_back_to_the_allowed_ones():
    logits = np.array([0.0, -np.inf, -np.inf, 1.0], dtype=np.float32)
    mask = np.array([False, True, True, False])
    assert Sampler(SamplingParams(temperature=0)).sample(logits, mask).token_id == 1
    assert support(Sampler(params()), logits, 200, mask) == {1, 2}


# --- seeds ------------------------------------------------------------------------------


def test_a_seed_makes_sampling_reproducible():
    params_ = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, seed=42)
    s1, s2 = Sampler(params_), Sampler(params_)
    a = [s1(LOGITS) for _ in range(40)]
    b = [s2(LOGITS) for _ in range(40)]
    assert a == b
    assert len(set(a)) > 1, "temperature 1.5 over close logits must vary"


def test_different_seeds_give_different_sequences():
    samplers = [Sampler(params(seed=seed)) for seed in range(5)]
    assert len({tuple(s(QUARTET) for _ in range(30)) for s in samplers}) == 5


def test_any_integer_seed_is_reproducible():
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    for seed in (-5, 0, 2**70):
        params_ = SamplingParams(temperature=1.0, seed=seed)
        first = [Sampler(params_)(logits) for _ in range(3)]
        assert len(set(first)) == 1


# --- logprobs ---------------------------------------------------------------------------


def test_no_logprobs_unless_asked():
    assert Sampler(params()).sample(LOGITS) == Sample(Sampler(params()).sample(LOGITS).token_id)


def test_the_chosen_logprob_is_the_log_softmax_at_the_temperature_before_truncation():
    s = Sampler(params(temperature=0.7, top_k=2, top_p=0.5, logprobs=True, seed=9))
    expected = log_softmax(LOGITS.astype(np.float64) / 0.7)
    for _ in range(20):
        got = s.sample(LOGITS)
        assert got.logprob == pytest.approx(expected[got.token_id], rel=1e-12)
        assert got.top == ()


def test_greedy_logprobs_are_at_temperature_one():
    got = Sampler(SamplingParams(temperature=0, logprobs=True)).sample(LOGITS)
    assert got.token_id == 1
    assert got.logprob == pytest.approx(log_softmax(LOGITS)[1], rel=1e-12)


def test_top_logprobs_at_temperature_zero_start_with_the_chosen_token():
    logits = np.random.default_rng(3).standard_normal(20).astype(np.float32)
    got = Sampler(SamplingParams(temperature=0, top_logprobs=5)).sample(logits)
    ids = [i for i, _ in got.top]
    values = [v for _, v in got.top]
    assert len(got.top) == 5 and ids[0] == got.token_id == int(np.argmax(logits))
    assert ids == list(np.argsort(-logits, kind="stable")[:5])
    assert values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1.0
    assert got.logprob == values[0]  # top_logprobs alone reports the chosen one too
    np.testing.assert_allclose(values, log_softmax(logits)[ids], rtol=1e-12)


def test_top_logprobs_are_clamped_to_20():
    logits = np.random.default_rng(4).standard_normal(30).astype(np.float32)
    assert len(Sampler(params(top_logprobs=1000)).sample(logits).top) == MAX_TOP_LOGPROBS
    got = Sampler(params(top_logprobs=-4)).sample(logits)
    assert got.top == () and got.logprob is None


def test_top_logprobs_leave_out_masked_tokens():
    mask = np.array([True, False, True, False, True])
    got = Sampler(SamplingParams(temperature=0, top_logprobs=5)).sample(LOGITS, mask)
    assert [i for i, _ in got.top] == [2, 0, 4]
    assert sum(math.exp(v) for _, v in got.top) == pytest.approx(1.0)


# --- safety -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=float("nan")),
        dict(temperature=float("inf")),
        dict(temperature=1e-300),
        dict(top_p=float("nan"), min_p=float("nan")),
        dict(top_p=-3.0, min_p=7.0),
        dict(top_k=-9),
        dict(top_k=10**12),
        dict(repetition_penalty=0.0),
        dict(repetition_penalty=-1.0),
        dict(repetition_penalty=float("nan")),
        dict(repetition_penalty=float("inf")),
        dict(repetition_penalty=1e-300),
        dict(presence_penalty=float("nan"), frequency_penalty=float("inf")),
        dict(logit_bias=((0, float("inf")), (1, float("-inf")))),
        dict(top_logprobs=10**9, logprobs=True),
    ],
)
def test_any_parameter_value_gives_a_valid_token(kw):
    s = Sampler(params(**kw))
    for t in range(5):
        s.accept(t)
    for _ in range(5):
        got = s.sample(LOGITS)
        assert 0 <= got.token_id < len(LOGITS)
        assert got.logprob is None or not math.isnan(got.logprob)
        s.accept(got.token_id)


# --- batches ----------------------------------------------------------------------------

BATCH_PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0, logprobs=True, top_logprobs=3, presence_penalty=0.7),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=2, logprobs=True),
    SamplingParams(temperature=1.3, top_k=0, top_p=0.9, seed=3, frequency_penalty=0.4),
    SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.1, seed=4, top_logprobs=5),
    SamplingParams(temperature=1.1, top_k=5, seed=5, repetition_penalty=1.3),
    SamplingParams(
        temperature=0.7, seed=6, logit_bias=((3, 5.0), (10**9, 1.0)), presence_penalty=-0.5
    ),
]


@pytest.mark.parametrize("V", [20, 1001, 4099, 49152])
def test_a_batch_samples_each_row_bit_for_bit_as_alone(V):
    rng = np.random.default_rng(V)
    batched = [Sampler(p) for p in BATCH_PARAMS]
    alone = [Sampler(p) for p in BATCH_PARAMS]
    B = len(batched)
    for step in range(12):
        logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)
        masks = [None] * B
        for i in (1, 3, 6):  # some rows under a grammar, changing per step
            masks[i] = rng.random(V) < 0.3 + 0.05 * step
            masks[i][rng.integers(V)] = True
        got = sample_batch(batched, logits, masks)
        want = [s.sample(logits[i], masks[i]) for i, s in enumerate(alone)]
        assert got == want, step
        for s, a, g in zip(batched, alone, got, strict=True):
            s.accept(g.token_id)
            a.accept(g.token_id)
    assert any(s.logprob is not None for s in got)


def test_a_batch_with_an_empty_mask_raises_before_any_rng_moves():
    samplers = [Sampler(params(seed=i)) for i in range(3)]
    states = [s.rng.bit_generator.state for s in samplers]
    logits = np.zeros((3, 5), dtype=np.float32)
    with pytest.raises(ValueError):
        sample_batch(samplers, logits, [None, np.ones(5, bool), np.zeros(5, bool)])
    assert [s.rng.bit_generator.state for s in samplers] == states
    with pytest.raises(ValueError):
        sample_batch(samplers, logits[:2])
    assert sample_batch([], np.zeros((0, 5), dtype=np.float32)) == []


def test_a_forced_token_reports_its_logprob_under_the_sampling_distribution():
    from engine.decoding.sampler import forced_sample

    logits = np.array([2.0, 1.0, 0.5, -1.0])
    params = SamplingParams(temperature=0.5, logprobs=True, top_logprobs=2, logit_bias=((1, 3.0),))
    drawn = Sampler(params).sample(logits)
    forced = forced_sample(Sampler(params), logits, 3)
    assert forced.token_id == 3
    assert forced.top == drawn.top  # the same distribution
    x = (logits + np.array([0, 3.0, 0, 0])) / 0.5
    expected = x[3] - np.log(np.exp(x).sum())
    assert forced.logprob == pytest.approx(expected)
    assert forced_sample(Sampler(SamplingParams()), logits, 3).logprob is None
