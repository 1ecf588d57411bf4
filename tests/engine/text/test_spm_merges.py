"""The SentencePiece merges derived from a vocabulary: the compiled split helper and the
Python loop give the same merges, ranked by score (ties by the pair's ids)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.text import tokenizer
from engine.text.tokenizer import TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL


def _vocab(seed: int):
    rng = np.random.default_rng(seed)
    alphabet = list("ab▁é漢") + ["<0x41>"]
    pieces = list(
        dict.fromkeys(
            alphabet + ["".join(rng.choice(alphabet[:5], n)) for n in rng.integers(2, 7, 400)]
        )
    )
    types = [TOKEN_BYTE if p.startswith("<0x") else TOKEN_NORMAL for p in pieces]
    types[0] = TOKEN_CONTROL  # a control piece is never split
    scores = [float(s) for s in rng.integers(-20, 0, len(pieces))]  # many ties
    vocab = {p: i for i, p in enumerate(pieces)}
    return pieces, types, scores, vocab


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_and_python_splits_give_the_same_merges(seed, monkeypatch):
    if tokenizer._compiled_splits() is None:
        pytest.skip("the compiled kernels are not built here")
    pieces, types, scores, vocab = _vocab(seed)
    compiled = tokenizer._spm_merges(pieces, types, scores, vocab)
    monkeypatch.setattr(tokenizer, "_compiled_splits", lambda: None)
    python = tokenizer._spm_merges(pieces, types, scores, vocab)
    assert compiled == python and len(compiled) > 100


def test_merges_are_every_split_ranked_by_the_pieces_score():
    pieces = ["a", "b", "c", "ab", "bc", "abc"]
    types = [TOKEN_NORMAL] * 6
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -0.5]
    merges = tokenizer._spm_merges(pieces, types, scores, {p: i for i, p in enumerate(pieces)})
    # abc (-0.5) splits as a|bc and ab|c (ties by ids: a=0 before ab=3), then ab, then bc
    assert merges == [("a", "bc"), ("ab", "c"), ("a", "b"), ("b", "c")]
