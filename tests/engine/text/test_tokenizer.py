"""GGUF vocab -> tokenizers: ids identical to the references, exact incremental decoding."""

from __future__ import annotations

import logging

import pytest

from engine.text.tokenizer import Tokenizer, bytes_to_unicode

MULTIBYTE = [
    "emoji 😀🎉👍🏽 and 🇫🇷 flags",
    "日本語のテキストです。中文测试，标点符号！",
    "Привет, как дела? مرحبا بالعالم",
    "Zero\u200bwidth\u200djoiner Ω≈ç√∫˜µ≤≥÷ 👨‍👩‍👧‍👦",
    "<|im_start|>assistant\n🙂 ok<|im_end|>",
]


def corpus(smollm2_f32) -> list[str]:
    return [e["text"] for e in smollm2_f32["tokenize"]]


def test_the_shipped_gguf_is_the_one_the_references_were_made_from(
    smollm2_sha256, smollm2_f32, smollm2_llamacpp
):
    assert smollm2_sha256 == smollm2_f32["sha256"] == smollm2_llamacpp["sha256"], (
        "SmolLM2 GGUF changed: the reference outputs no longer describe it"
    )


def test_it_builds_from_a_gguf_reader(small_gguf, gguf_kv):
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(small_gguf)
    tok = Tokenizer.from_gguf(reader)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (4, 0, 3, True)
    assert tok.encode("abab<|im_end|>", add_special=True) == [0, 2, 2, 3]
    assert tok.end_of_turn_ids == {3}
    # The fast test-only header reader agrees with GGUFReader.
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert gguf_kv(small_gguf) == fields


def test_it_reads_the_smollm2_vocab_settings(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tok.vocab_size == 49152
    assert tok.pre == "smollm"
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)
    assert tok.token_text(2) == "<|im_end|>"
    assert tok.token_id("<|im_start|>") == 1
    assert tok.end_of_turn_ids == {0, 2}  # <|endoftext|>, <|im_end|> (the eos)
    assert tok.special_ids == set(range(17))


def test_it_matches_the_float32_reference_ids_for_every_corpus_string(
    smollm2_tokenizer, smollm2_f32
):
    entries = smollm2_f32["tokenize"]
    assert len(entries) >= 50
    wrong = [
        (e["text"], got, e["ids"])
        for e in entries
        if (got := smollm2_tokenizer.encode(e["text"])) != e["ids"]
    ]
    assert not wrong, f"{len(wrong)}/{len(entries)} differ, first: {wrong[0]!r}"


def test_it_matches_llama_cpp_with_special_token_parsing(smollm2_tokenizer, smollm2_llamacpp):
    entries = smollm2_llamacpp["tokenize_special"]
    wrong = [e["text"] for e in entries if smollm2_tokenizer.encode(e["text"]) != e["ids"]]
    assert not wrong, f"{len(wrong)}/{len(entries)} differ, first: {wrong[0]!r}"


def test_add_special_adds_no_bos_when_the_gguf_says_not_to(smollm2_tokenizer):
    text = "<|im_start|>user\nHi<|im_end|>"
    assert smollm2_tokenizer.encode(text, add_special=True) == smollm2_tokenizer.encode(text)


def test_add_special_prepends_bos_when_the_gguf_asks(smollm2_metadata):
    tok = Tokenizer.from_gguf({**smollm2_metadata, "tokenizer.ggml.add_bos_token": True})
    assert tok.encode("Hello", add_special=True) == [1, *tok.encode("Hello")]
    assert tok.encode("Hello")[0] != 1


def test_special_tokens_in_text_are_single_tokens(smollm2_tokenizer):
    assert smollm2_tokenizer.encode("<|im_end|><|endoftext|>") == [2, 0]
    assert smollm2_tokenizer.encode("x<jupyter_code>y")[1] == 13


def test_decode_round_trips_the_corpus(smollm2_tokenizer, smollm2_f32):
    for text in [*corpus(smollm2_f32), *MULTIBYTE]:
        assert smollm2_tokenizer.decode(smollm2_tokenizer.encode(text)) == text


def test_special_tokens_decode_to_their_text(smollm2_tokenizer):
    assert smollm2_tokenizer.decode([1, 4093, 198, 2]) == "<|im_start|>user\n<|im_end|>"
    assert smollm2_tokenizer.token_bytes(2) == b"<|im_end|>"
    assert smollm2_tokenizer.token_bytes(216) == b" "  # stored as "Ġ"


def test_single_byte_tokens_decode_to_their_byte(smollm2_tokenizer):
    # SmolLM2's vocab lacks 21 of the 256 byte tokens (0xC0, 0xF5.., some C0 controls).
    found = {
        b: smollm2_tokenizer.token_bytes(i)
        for b, c in bytes_to_unicode().items()
        if (i := smollm2_tokenizer.token_id(c)) is not None
    }
    assert len(found) == 235
    assert all(v == bytes([b]) for b, v in found.items())


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    detok = tok.detokenizer()
    return [detok.push(i) for i in ids] + [detok.flush()]


def test_detokenizer_yields_exactly_the_text_token_by_token(smollm2_tokenizer, smollm2_f32):
    for text in [*MULTIBYTE, *corpus(smollm2_f32)]:
        pieces = stream(smollm2_tokenizer, smollm2_tokenizer.encode(text))
        assert "".join(pieces) == text
        assert not any("\ufffd" in p for p in pieces), text


def test_detokenizer_holds_a_split_character_until_it_completes(smollm2_tokenizer):
    tok = smollm2_tokenizer
    byte_ids = {b: tok.token_id(c) for b, c in bytes_to_unicode().items()}
    ids = [byte_ids[b] for b in "a😀".encode()]  # one token per byte: 'a', then 4 bytes
    assert stream(tok, ids) == ["a", "", "", "", "😀", ""]


def test_detokenizer_flush_replaces_an_unfinished_character(smollm2_tokenizer):
    tok = smollm2_tokenizer
    byte_ids = {b: tok.token_id(c) for b, c in bytes_to_unicode().items()}
    detok = tok.detokenizer()
    assert detok.push(byte_ids[0xF0]) == ""
    assert detok.push(byte_ids[0x9F]) == ""
    assert detok.flush() == "\ufffd"


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_tiny_reference_models_load_and_round_trip(name, reference_dir, gguf_kv, smollm2_f32):
    path = reference_dir / "tiny" / f"{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    tok = Tokenizer.from_gguf(gguf_kv(path))
    assert tok.vocab_size == 49152 and tok.pre == "smollm"  # SmolLM2's vocabulary
    for entry in smollm2_f32["tokenize"]:
        assert tok.encode(entry["text"]) == entry["ids"]
        assert tok.decode(entry["ids"]) == entry["text"]


def tiny_vocab(pre: str, merges=(), **kw) -> Tokenizer:
    """Byte alphabet plus a few merged tokens and two control tokens."""
    alphabet = list(bytes_to_unicode().values())
    extra = ["".join(m.split(" ")) for m in merges]
    tokens = [*alphabet, *extra, "<|im_end|>", "<|endoftext|>"]
    types = [1] * (len(alphabet) + len(extra)) + [3, 3]
    return Tokenizer(tokens, list(merges), types, pre=pre, **kw)


def pieces(tok: Tokenizer, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok.encode(text)]


def test_gpt2_keeps_digit_runs_together_and_smollm_splits_them():
    merges = ["Ġ 1", "1 2", "12 3"]
    gpt2 = tiny_vocab("gpt2", merges)
    assert pieces(gpt2, " 123") == [" 1", "2", "3"]  # " 123" is one pre-token
    assert pieces(gpt2, "123") == ["123"]
    smollm = tiny_vocab("smollm", merges)
    assert pieces(smollm, " 123") == [" ", "1", "2", "3"]
    assert pieces(smollm, "123") == ["1", "2", "3"]


def test_llama3_groups_digits_by_three_and_qwen2_by_one():
    merges = ["1 2", "12 3", "4 5"]
    assert pieces(tiny_vocab("llama-bpe", merges), "12345") == ["123", "45"]
    assert pieces(tiny_vocab("qwen2", merges), "12345") == ["1", "2", "3", "4", "5"]


def test_llama3_takes_a_whole_word_in_the_vocab_before_merging():
    alphabet = list(bytes_to_unicode().values())
    tokens, merges = [*alphabet, "ab", "abc"], ["a b"]  # no merge reaches "abc"
    assert pieces(Tokenizer(tokens, merges, pre="llama-bpe"), "abc") == ["abc"]
    assert pieces(Tokenizer(tokens, merges, pre="qwen2"), "abc") == ["ab", "c"]


def test_llama3_and_qwen2_attach_one_punctuation_char_to_a_word():
    for pre in ("llama3", "qwen2"):
        tok = tiny_vocab(pre, ["Ġ a", "Ġa b"])
        split = [w for w, _ in tok.hf.pre_tokenizer.pre_tokenize_str("(ab's ab\n\n x")]
        assert split == ["(ab", "'s", "Ġab", "ĊĊ", "Ġx"], pre


def test_gpt4o_splits_case_runs_keeps_contractions_and_groups_digits_by_three():
    # o200k's pre-tokenizer (gpt-oss, `tokenizer.ggml.pre` "gpt-4o"), by its regex's
    # alternatives: upper* lower+ with a contraction, digits in threes, newlines
    # together, a lone space before a non-space.
    tok = tiny_vocab("gpt-4o")
    text = "Hello World's CamelCase HTTPServer 12345 a/b\n\n  x"
    split = [w for w, _ in tok.hf.pre_tokenizer.pre_tokenize_str(text)]
    byte = {c: b for b, c in bytes_to_unicode().items()}
    words = [bytes(byte[c] for c in w).decode() for w in split]
    assert words == [
        "Hello",
        " World's",
        " Camel",
        "Case",
        " HTTPServer",
        " ",
        "123",
        "45",
        " a",
        "/b",  # a word may take one leading non-letter
        "\n\n",
        " ",
        " x",
    ]


def test_an_unknown_pre_tokenizer_falls_back_to_gpt2_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        tok = tiny_vocab("no-such-pre", ["1 2"])
    assert "no-such-pre" in caplog.text
    assert pieces(tok, "12") == ["12"]


def test_end_of_turn_ids_include_eos_and_known_turn_markers():
    tok = tiny_vocab("gpt2", eos_id=5)
    n = tok.vocab_size
    assert tok.end_of_turn_ids == {5, n - 2, n - 1}


def test_from_gguf_refuses_an_unknown_tokenizer_model():
    with pytest.raises(NotImplementedError, match="'bert'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})


def tiny_spm(add_space_prefix: bool = True) -> Tokenizer:
    pieces = [("<unk>", 3, 0.0), ("<s>", 3, 0.0), ("</s>", 3, 0.0)]
    pieces += [(f"<0x{b:02X}>", 6, 0.0) for b in range(256)]
    pieces += [("\u2581", 1, -1.0), ("a", 1, -2.0), ("b", 1, -2.0), ("c", 1, -2.0)]
    pieces += [("ab", 1, -3.0), ("bc", 1, -0.5), ("\u2581a", 1, -4.0), ("\u2581ab", 1, -5.0)]
    tokens, types, scores = (list(x) for x in zip(*pieces, strict=True))
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_space_prefix": add_space_prefix,
        }
    )


def test_sentencepiece_merges_the_highest_scoring_pair_first():
    tok = tiny_spm()
    ids = tok.encode("abc")
    # "bc" (-0.5) outranks "ab" (-3.0), so "▁abc" -> "▁a" + "bc", not "▁ab" + "c".
    assert [tok.token_text(i) for i in ids] == ["\u2581a", "bc"]
    assert tok.decode(ids) == " abc"  # the prefix space is part of the text, as in llama.cpp
    assert tok.add_bos and tok.encode("abc", add_special=True)[0] == 1


def test_sentencepiece_falls_back_to_byte_pieces():
    tok = tiny_spm(add_space_prefix=False)
    ids = tok.encode("aé")
    assert [tok.token_text(i) for i in ids] == ["a", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "aé"
    detok = tok.detokenizer()
    assert [detok.push(i) for i in ids] == ["a", "", "é"]
