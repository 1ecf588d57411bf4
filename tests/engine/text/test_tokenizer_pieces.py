"""A long text is encoded a piece at a time (engine/text/tokenizer.py `safe_pieces`), so the
Rust encoder never holds a 2 MB text's per-token structures at once; the ids are the whole
text's for every BPE pre-tokenizer family, cut wherever the pieces fall."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest

from engine.text import tokenizer as tokenizer_module
from engine.text.tokenizer import Tokenizer, safe_pieces

# One pre-token name per family (tokenizer.py _PRE_FAMILIES), on SmolLM2's vocabulary.
FAMILIES = ("gpt2", "smollm", "llama-bpe", "qwen2", "gpt-4o")


def varied_text(n_words: int, seed: int = 0) -> str:
    """Words, contractions, digit runs, punctuation, case runs, non-ASCII letters,
    whitespace runs and newlines, and a special token now and then."""
    rng = random.Random(seed)
    extras = [
        "don't",
        "it's",
        "we'll",
        "12345",
        "3.14",
        "(x)",
        "a/b",
        "HTTPServer",
        "CamelCase",
        "naïve",
        "größe",
        "日本語",
        "émigré",
        "--",
        "!!",
        "\n",
        "\n\n",
        "  ",
        "\t",
        "<|im_start|>",
        "<|im_end|>",
        "  x",
        "'s",
        "A1b2",
    ]
    out = []
    for _ in range(n_words):
        if rng.random() < 0.25:
            out.append(rng.choice(extras))
        else:
            out.append("".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 9))))
        out.append(rng.choice([" ", " ", " ", "", "\n", ", "]))
    return "".join(out)


@pytest.fixture(scope="module", params=FAMILIES)
def family_tokenizer(request, smollm2_metadata) -> Tokenizer:
    return Tokenizer.from_gguf({**smollm2_metadata, "tokenizer.ggml.pre": request.param})


def whole_ids(tok: Tokenizer, text: str) -> list[int]:
    return tok._encode_batch([text], add_special_tokens=False)[0].ids


def test_pieces_cover_the_text_and_cut_only_between_letters():
    text = varied_text(4000)
    pieces = list(safe_pieces(text, 200, 50))
    assert "".join(pieces) == text and len(pieces) > 20
    for a, b in zip(pieces, pieces[1:], strict=False):
        assert a[-1] in string.ascii_letters and b[0] == " " and b[1] in string.ascii_letters


def test_a_stretch_without_a_safe_space_stays_whole():
    text = "ab " * 10 + "1" * 500 + " cd" * 10
    pieces = list(safe_pieces(text, 20, 5))
    assert "".join(pieces) == text
    assert any("1" * 500 in p for p in pieces)


@pytest.mark.parametrize("size,search", [(40, 10), (257, 31), (1000, 200)])
def test_ids_by_pieces_are_the_whole_texts(family_tokenizer, monkeypatch, size, search):
    tok = family_tokenizer
    assert tok._cuts_pieces
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", size)
    monkeypatch.setattr(tokenizer_module, "PIECE_SEARCH", search)
    for seed in range(3):
        text = varied_text(3000, seed)
        assert tok.encode(text) == whole_ids(tok, text), (tok.pre, seed)
        array = tok.encode_array(text)  # /tokenize's int32 form: the same ids
        assert array.dtype == np.int32 and array.tolist() == whole_ids(tok, text)


def test_a_2mb_text_reaches_the_encoder_in_pieces(smollm2_tokenizer, monkeypatch):
    tok = smollm2_tokenizer
    seen: list[int] = []
    encode_batch = tok._encode_batch

    def spy(texts, **kw):
        seen.extend(len(t) for t in texts)
        return encode_batch(texts, **kw)

    monkeypatch.setattr(tok, "_encode_batch", spy)
    text = "lorem ipsum dolor sit amet " * 80_000
    ids = tok.encode(text)
    monkeypatch.setattr(tok, "_cuts_pieces", False)
    assert ids == tok.encode(text)
    pieces = seen[:-1]  # the last call: the whole text, pieces off
    assert seen[-1] == len(text) and len(pieces) > 20
    limit = tokenizer_module.PIECE_CHARS + tokenizer_module.PIECE_SEARCH
    assert max(pieces) <= limit and sum(pieces) == len(text)
    monkeypatch.setattr(tok, "_cuts_pieces", True)
    assert tok.encode_array(text, add_special=True).tolist() == tok.encode(text, add_special=True)
    for short in ("", "hi"):
        assert tok.encode_array(short).tolist() == tok.encode(short)


def test_special_tokens_with_spaces_turn_pieces_off(smollm2_metadata):
    tokens = [*smollm2_metadata["tokenizer.ggml.tokens"], "<|a special token|>"]
    types = [*smollm2_metadata["tokenizer.ggml.token_type"], 3]
    meta = {**smollm2_metadata, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    assert not Tokenizer.from_gguf(meta)._cuts_pieces


def test_sentencepiece_is_not_cut():
    # Its BPE runs over the whole text (spaces are "▁" pieces, no pre-tokenizer), so a
    # cut could split a merge.
    alphabet = ["<unk>", "\u2581", "a", "b"]
    tok = Tokenizer(alphabet, [], [2, 1, 1, 1], model="llama", scores=[0.0, -1.0, -2.0, -3.0])
    assert not tok._cuts_pieces
