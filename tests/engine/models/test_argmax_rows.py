"""forward_decode's `argmax`: greedy rows may skip the logits that cannot win.

A row marked with its bans keeps linear's own value for every id that could be its
largest allowed logit (-inf elsewhere), so greedy decoding picks what the full row picks;
unmarked rows in the same pass are the full rows, bit for bit. Which sequences ask is
DecodeState.argmax_bans: plain greedy only.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.decoding.sampler import Sampler
from engine.decoding.state import DecodeState
from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from engine.types import SamplingParams


@pytest.fixture(scope="module")
def smollm2(smollm2_path, cpu):
    gf = GGUFFile(smollm2_path)
    return architecture_module(gf.architecture).load(gf, backend=cpu)


def _prefilled(model, rows: int):
    kv = model.make_kv_cache(rows, 128)
    rng = np.random.default_rng(2)
    for slot in range(rows):
        model.forward(rng.integers(5, 30000, size=20 + 3 * slot), 0, kv, slot)
    return kv, [20 + 3 * slot for slot in range(rows)]


def test_greedy_rows_pick_the_full_rows_argmax_for_twelve_steps(smollm2):
    B, eos = 8, 2
    screens = smollm2.backend.ext.greedy_fast()  # AVX-512 VNNI; elsewhere full rows
    kv_full, lengths = _prefilled(smollm2, B)
    kv_argmax, _ = _prefilled(smollm2, B)
    bans = [frozenset({eos}) if b % 2 else frozenset() for b in range(B)]
    tokens = [int(t) for t in np.random.default_rng(3).integers(5, 30000, size=B)]
    for _ in range(12):
        ref = smollm2.forward_decode(tokens, lengths, list(range(B)), kv_full)
        got = smollm2.forward_decode(tokens, lengths, list(range(B)), kv_argmax, argmax=bans)
        ref[1::2, eos] = -np.inf
        kept = np.isfinite(got)
        assert np.array_equal(got[kept], ref[kept])
        if screens:  # the screen ran: most of each row skipped
            assert kept.sum(axis=1).max() < 1000
        chosen = np.argmax(got, axis=1)
        assert np.array_equal(chosen, np.argmax(ref, axis=1))
        tokens, lengths = [int(t) for t in chosen], [n + 1 for n in lengths]


def test_unmarked_rows_beside_greedy_ones_are_the_full_rows(smollm2):
    B = 6
    kv_a, lengths = _prefilled(smollm2, B)
    kv_b, _ = _prefilled(smollm2, B)
    tokens = [11, 22, 33, 44, 55, 66]
    ref = smollm2.forward_decode(tokens, lengths, list(range(B)), kv_a)
    marks = [frozenset(), None, frozenset(), frozenset(), None, frozenset()]
    got = smollm2.forward_decode(tokens, lengths, list(range(B)), kv_b, argmax=marks)
    for b in (1, 4):
        assert np.array_equal(got[b], ref[b])
    assert np.array_equal(np.argmax(got, axis=1), np.argmax(ref, axis=1))


@pytest.mark.parametrize(
    "params, bans",
    [
        (SamplingParams(temperature=0), frozenset()),
        (SamplingParams(temperature=0, logit_bias=((2, float("-inf")),)), frozenset({2})),
        (SamplingParams(temperature=0.7), None),
        (SamplingParams(temperature=0, logprobs=True), None),
        (SamplingParams(temperature=0, repetition_penalty=1.2), None),
        (SamplingParams(temperature=0, logit_bias=((2, 5.0),)), None),
    ],
)
def test_only_plain_greedy_sequences_ask_for_the_argmax_alone(params, bans):
    assert DecodeState(Sampler(params)).argmax_bans == bans
    grammar = DecodeState(Sampler(params), make_constraint=lambda: None)
    assert grammar.argmax_bans is None  # a grammar's mask reads other ids
