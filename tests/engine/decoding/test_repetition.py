"""The loop detector: fires on a stuck decode, never on legitimate repetition."""

from __future__ import annotations

from engine.decoding.repetition import MIN_SPAN, LoopDetector


def first_fire(tokens) -> int | None:
    """Index of the token at which the detector fires, or None."""
    d = LoopDetector()
    for i, t in enumerate(tokens):
        if d.push(t):
            return i
    return None


def test_one_token_repeated_fires_at_the_minimum_span():
    assert first_fire([5] * 200) == MIN_SPAN - 1


def test_a_sentence_said_over_and_over_fires_after_four_copies():
    sentence = list(range(100, 120))  # 20 tokens
    at = first_fire([1, 2, 3] + sentence * 10)
    assert at == 3 + 4 * 20 - 1


def test_a_long_block_needs_four_copies():
    block = list(range(1000, 1100))  # 100 tokens
    assert first_fire(block * 3) is None
    assert first_fire(block * 4) == 4 * 100 - 1


def test_a_list_of_numbers_never_fires():
    # "1, 2, 3, ..., 500" as tokens: the number tokens change, the commas do not.
    comma = 11
    tokens = []
    for n in range(1, 501):
        tokens += [1000 + n, comma]
    assert first_fire(tokens) is None


def test_a_short_refrain_repeated_a_few_times_does_not_fire():
    refrain = [7, 8, 9, 10, 11]
    assert first_fire(refrain * 12) is None  # 60 tokens < MIN_SPAN
    assert first_fire([1, 2] * 31) is None  # 62 tokens


def test_repeated_lines_that_differ_somewhere_do_not_fire():
    rows = []
    for i in range(60):  # "| x | y |" table rows with a changing cell
        rows += [30, 31, 500 + i, 32, 33, 34, 35]
    assert first_fire(rows) is None


def test_it_reports_the_period():
    d = LoopDetector()
    for t in [4, 5, 6] * 40:
        if d.push(t):
            break
    assert d.fired_period == 3
