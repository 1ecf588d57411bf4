"""GGUF `tokenizer.ggml.*` metadata -> a `tokenizers.Tokenizer`, plus exact byte-level decoding.

Encoding goes through the Rust `tokenizers` BPE; decoding uses a per-token byte table built
once here, so that streaming one token at a time is O(1) and byte-exact.
"""

from __future__ import annotations

import codecs
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..foreground import FOREGROUND

log = logging.getLogger(__name__)

# A long text is encoded a piece at a time: the Rust encoder's per-token structures cost
# ~250 bytes a token (+280 MB for a 2 MB text), one piece's only that piece's. Pieces end
# where every BPE pre-tokenizer here starts a new pre-token whatever follows: at a space
# between two ASCII letters (the word before ends at the letter, " word" starts at the
# space), so merges never cross a cut and the ids are the whole text's.
PIECE_CHARS = 64 * 1024  # a piece's length, about (cut at the first safe space after it)
PIECE_SEARCH = 4096  # how far past PIECE_CHARS to look for a safe space
PIECE_YIELD_S = 0.1  # between pieces, the longest wait for a running prefill (foreground.py)
_SAFE_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_BYTE = 6  # SentencePiece byte-fallback pieces, spelled <0xAB>

SPM_SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Texts that end a turn for the chat formats we know, beyond the model's own eos. Harmony
# (gpt-oss) ends a turn with <|return|> (the answer) or <|call|> (a tool call); its
# <|end|> only ends one message of the turn, as llama.cpp has it.
END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|return|>",
    "<|call|>",
)

# Pre-tokenizer regexes, per llama.cpp's llama-vocab.cpp grouping of `tokenizer.ggml.pre`.
# Written as the original HF tokenizer.json patterns (Oniguruma understands `(?i:...)`).
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# o200k (gpt-4o, gpt-oss, llama4): cased words keep their case-run shape, contractions
# ride on the word, digits in threes, punctuation runs may take trailing newlines or "/".
_GPT4O_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PATTERNS = {"llama3": _LLAMA3_PATTERN, "qwen2": _QWEN2_PATTERN, "gpt4o": _GPT4O_PATTERN}
_PRE_FAMILIES = {
    "gpt2": ("gpt2", "gpt-2", "default", "phi-2", "mpt", "olmo", "jais", "roberta-bpe"),
    "digits_gpt2": ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"),
    "llama3": ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan"),
    "gpt4o": ("gpt-4o", "llama4"),
}
PRE_TOKENIZER_FAMILY = {name: family for family, names in _PRE_FAMILIES.items() for name in names}
# llama.cpp turns on ignore_merges (and a default add_bos) for these only, not dbrx/smaug.
_LLAMA3_PROPER = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"})


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


def gguf_metadata(source: Any, prefix: str = "tokenizer.") -> dict[str, Any]:
    """Plain Python values of the metadata keys under `prefix`.

    `source` is a `gguf.GGUFReader`, its `.fields`, or a mapping of already-decoded values.
    """
    fields = getattr(source, "fields", source)
    if not isinstance(fields, Mapping):
        raise TypeError(f"expected a GGUFReader or a metadata mapping, got {type(source)!r}")
    out = {}
    for key, value in fields.items():
        if key.startswith(prefix):
            out[key] = value.contents() if hasattr(value, "contents") else value
    return out


def _make_pre_tokenizer(pre: str) -> tuple[Any, bool]:
    """(pre-tokenizer, BPE ignore_merges) for a `tokenizer.ggml.pre` value."""
    family = PRE_TOKENIZER_FAMILY.get(pre)
    if family is None:
        log.warning("unknown tokenizer.ggml.pre %r: falling back to the GPT-2 pre-tokenizer", pre)
        family = "gpt2"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if family == "gpt2":
        return byte_level, False
    if family == "digits_gpt2":
        # llama.cpp splits every \p{N} alone first, then applies the GPT-2 regex.
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    pattern = _SPLIT_PATTERNS[family]
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    # llama.cpp (and HF's tokenizer.json) look a whole llama3 word up before merging.
    return pre_tokenizers.Sequence([split, bytes_only]), pre in _LLAMA3_PROPER


def _split_merge(merge: str) -> tuple[str, str]:
    cut = merge.find(" ", 1)  # from 1, as llama.cpp does: a left part may itself be " "
    if cut < 0:
        raise ValueError(f"malformed BPE merge {merge!r}")
    return merge[:cut], merge[cut + 1 :]


def _spm_token_bytes(text: str, token_type: int) -> bytes:
    if token_type == TOKEN_BYTE and len(text) == 6 and text.startswith("<0x"):
        return bytes([int(text[3:5], 16)])
    if token_type == TOKEN_CONTROL:
        return text.encode("utf-8")
    return text.replace(SPM_SPACE, " ").encode("utf-8")


def _spm_merges(tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int]):
    """BPE merges equivalent to SentencePiece's score-driven bigram merging.

    llama.cpp's SPM tokenizer repeatedly joins the adjacent pair whose concatenation is the
    highest-scoring vocabulary piece; a BPE whose merges are ranked by that score does the
    same. Every split of a normal piece into two vocabulary pieces is a merge.
    """
    # (piece index, left id, right id) of every split, in piece then cut order: compiled
    # where the CPU kernels are built (gemma3's 262k pieces have ~1.2M cuts: ~3x faster
    # than this loop, which took ~2 s of its first load), the same rows either way.
    splits = _compiled_splits()
    if splits is not None:
        normal = [
            kind == TOKEN_NORMAL and len(piece) >= 2
            for piece, kind in zip(tokens, types, strict=True)
        ]
        owner, left, right = splits(list(tokens), normal, vocab)
    else:
        rows = [
            (i, vocab[piece[:cut]], vocab[piece[cut:]])
            for i, (piece, kind) in enumerate(zip(tokens, types, strict=True))
            if kind == TOKEN_NORMAL
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        owner, left, right = (
            (np.asarray(c, dtype=np.int64) for c in zip(*rows, strict=True))
            if rows
            else (np.zeros(0, np.int64),) * 3
        )
    # Highest score first, ties by (left id, right id): what sorting (-score, ids) gave.
    score = np.asarray(scores, dtype=np.float64)[owner] if len(owner) else np.zeros(0)
    order = np.lexsort((right, left, -score))
    return [
        (tokens[i], tokens[j])
        for i, j in zip(left[order].tolist(), right[order].tolist(), strict=True)
    ]


def _compiled_splits():
    """The compiled kernels' SentencePiece split function where they were built, else None."""
    from kernels import compiled_spm_splits

    return compiled_spm_splits()


def spm_merges_of(source: Any) -> list[tuple[str, str]]:
    """The derived merges of a SentencePiece vocabulary ([] for BPE): tuples, which JSON
    writes as arrays (the weight cache) and the tokenizer takes as they are (gemma3's 513k
    pairs as lists cost 0.6 s of its first load, and as many again to turn back)."""
    meta = gguf_metadata(source)
    if meta.get("tokenizer.ggml.model") != "llama":
        return []
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    scores = [float(x) for x in meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))]
    return _spm_merges(tokens, types, scores, vocab)


def _token_bytes(text: str, token_type: int) -> bytes:
    if token_type in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
        return text.encode("utf-8")  # stored as plain text, not byte-level encoded
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in text)
    except KeyError:
        return text.encode("utf-8")  # a vocab entry outside the byte alphabet


def safe_pieces(text: str, size: int, search: int) -> Iterable[str]:
    """`text` cut into consecutive pieces of about `size` characters, each cut at the first
    safe space (_SAFE_CUT) in the `search` characters past `size`; a stretch without one
    stays whole until the next safe space."""
    start = 0
    while len(text) - start > size + search:
        found = _SAFE_CUT.search(text, start + size, start + size + search)
        if found is None:  # no safe space near: the piece grows to the next one
            found = _SAFE_CUT.search(text, start + size + search)
            if found is None:
                break
        yield text[start : found.start()]
        start = found.start()
    yield text[start:]


class TooManyTokens(Exception):
    """A text certain to exceed a token limit (Tokenizer.encode's `limit`)."""

    def __init__(self, at_least: int, limit: int):
        self.at_least = at_least
        self.limit = limit
        super().__init__(f"the text is at least {at_least} tokens; the limit is {limit}")


class Tokenizer:
    """A GGUF vocabulary: encode text to ids, decode ids to text or raw bytes."""

    def __init__(
        self,
        tokens: list[str],
        merges: list[str],
        token_types: list[int] | None = None,
        *,
        pre: str = "gpt2",
        model: str = "gpt2",
        scores: list[float] | None = None,
        add_space_prefix: bool = False,
        bos_id: int | None = None,
        eos_id: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        extra_end_ids: Iterable[int] = (),
    ):
        n = len(tokens)
        types = list(token_types) if token_types is not None else [TOKEN_NORMAL] * n
        if len(types) != n:
            raise ValueError(f"{n} tokens but {len(types)} token types")
        self.vocab_size = n
        self.pre = pre
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos and bos_id is not None
        self.add_eos = add_eos and eos_id is not None
        self._tokens = list(tokens)
        self._types = types

        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # first id wins where a vocab repeats a string
        self._ids = vocab
        if model == "llama":
            self._bytes = [_spm_token_bytes(t, k) for t, k in zip(tokens, types, strict=True)]
            # `merges` may carry precomputed SentencePiece merges (see spm_merges_of).
            pairs = [tuple(m) for m in merges] or _spm_merges(tokens, types, scores or [], vocab)
            hf = self._build_spm(pairs, scores, vocab, add_space_prefix)
        else:
            self._bytes = [_token_bytes(t, k) for t, k in zip(tokens, types, strict=True)]
            pairs = [_split_merge(m) for m in merges]
            pre_tokenizer, ignore_merges = _make_pre_tokenizer(pre)
            hf = HFTokenizer(models.BPE(vocab, pairs, ignore_merges=ignore_merges))
            hf.pre_tokenizer = pre_tokenizer
            hf.decoder = decoders.ByteLevel()
        specials = [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and t
        ]
        hf.add_special_tokens(specials)
        self.hf = hf
        # Pieces only where no pre-tokenizer is left out: not SentencePiece (its BPE runs
        # over the whole text), not where a special token's text holds a space.
        self._cuts_pieces = model != "llama" and not any(" " in a.content for a in specials)
        # Ids without character offsets (tokenizers >= 0.20); the same ids either way.
        self._encode_batch = getattr(hf, "encode_batch_fast", hf.encode_batch)
        # For min_tokens: the most characters one token can cover (each is at least one of
        # its bytes), 0 when unknown text can fold into one token; and the characters the
        # tokenizer drops (a byte-level vocabulary without their byte gives them no token).
        self._max_piece = max((len(b) for b in self._bytes), default=0)
        self._dropped: tuple[str, ...] = ()
        if model == "llama":  # unknown text falls back to the <0xAB> pieces, if all exist
            byte_pieces = {t for t, k in zip(tokens, types, strict=True) if k == TOKEN_BYTE}
            if not all(f"<0x{b:02X}>" in byte_pieces for b in range(256)):
                self._max_piece = 0
        else:
            missing = {b for c, b in _UNICODE_TO_BYTE.items() if c not in vocab}
            if any(0x80 <= b < 0xC0 for b in missing):  # a whole character could vanish
                self._max_piece = 0
            self._dropped = tuple(chr(b) for b in sorted(missing) if b < 0x80)
        self.special_ids = frozenset(
            i for i, k in enumerate(types) if k in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        )

        ends = {i for i in extra_end_ids if 0 <= i < n}
        if eos_id is not None:
            ends.add(eos_id)
        ends.update(vocab[t] for t in END_OF_TURN_TEXTS if t in vocab)
        self.end_of_turn_ids = frozenset(ends)

    @staticmethod
    def _build_spm(pairs, scores, vocab, add_space_prefix: bool) -> HFTokenizer:
        """SentencePiece (`tokenizer.ggml.model == "llama"`): spaces become "▁", pieces merge
        by score, and text no piece covers falls back to <0xAB> byte pieces."""
        if scores is None:
            raise ValueError("a SentencePiece vocabulary needs tokenizer.ggml.scores")
        unk = next((t for t in ("<unk>",) if t in vocab), None)
        bpe = models.BPE(
            vocab,
            pairs,
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
        hf = HFTokenizer(bpe)
        steps = [normalizers.Prepend(SPM_SPACE)] if add_space_prefix else []
        hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
        return hf

    @classmethod
    def from_gguf(cls, source: Any, spm_merges: list | None = None) -> Tokenizer:
        """Build from a `gguf.GGUFReader` or a mapping of GGUF metadata (plain values).

        `spm_merges`: the result of `spm_merges_of` for the same vocabulary, cached, to skip
        the seconds it takes to derive them for a large SentencePiece vocabulary."""
        meta = gguf_metadata(source)
        kind = meta.get("tokenizer.ggml.model")
        if kind not in ("gpt2", "llama"):
            raise NotImplementedError(
                f"tokenizer.ggml.model {kind!r} is not supported (gpt2 BPE and llama SentencePiece)"
            )

        pre = str(meta.get("tokenizer.ggml.pre", "default"))

        def opt_id(key: str) -> int | None:
            v = meta.get(key)
            return None if v is None or int(v) < 0 else int(v)

        extra_ends = [opt_id(f"tokenizer.ggml.{k}") for k in ("eot_token_id", "eom_token_id")]
        return cls(
            list(meta["tokenizer.ggml.tokens"]),
            list(meta.get("tokenizer.ggml.merges", ())) if kind == "gpt2" else spm_merges or [],
            [int(t) for t in meta["tokenizer.ggml.token_type"]]
            if "tokenizer.ggml.token_type" in meta
            else None,
            pre=pre,
            model=kind,
            scores=[float(x) for x in meta["tokenizer.ggml.scores"]]
            if "tokenizer.ggml.scores" in meta
            else None,
            add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", kind == "llama")),
            bos_id=opt_id("tokenizer.ggml.bos_token_id"),
            eos_id=opt_id("tokenizer.ggml.eos_token_id"),
            # Absent key: llama.cpp adds BOS for SentencePiece and llama3-style vocabularies.
            add_bos=bool(
                meta.get("tokenizer.ggml.add_bos_token", kind == "llama" or pre in _LLAMA3_PROPER)
            ),
            add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
            extra_end_ids=[i for i in extra_ends if i is not None],
        )

    def encode(self, text: str, add_special: bool = False, limit: int | None = None) -> list[int]:
        """Token ids for `text`; special tokens written in it are recognised.

        `add_special` adds BOS (and EOS) only where the GGUF asks for them. `limit`: raise
        TooManyTokens, without tokenizing, when `text` is certain to be longer than that
        many tokens (min_tokens). The Rust tokenizer runs without the GIL (the batch
        methods release it; encode would hold it for the whole text), and without
        character offsets (`encode_batch_fast`: the same ids; tracking offsets took ~4x
        the memory, +430 MB at peak for a 2 MB text's 1.1 M tokens, against +100 MB).
        """
        if limit is not None:
            at_least = self.min_tokens(text)
            if at_least > limit:
                raise TooManyTokens(at_least, limit)
        ids = self._ids_of(text)
        if add_special and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def encode_array(self, text: str, add_special: bool = False) -> np.ndarray:
        """encode(text, add_special) as an int32 array, for texts that may be huge
        (/tokenize). A list of a 2 MB text's 1.1 M ids is ~40 MB of Python ints, whose
        small-object pools stay with the process after a flood of them; here each piece's
        ids become int32 at once (4 bytes each), so no more than a piece's ints live."""
        parts = [np.asarray(ids, dtype=np.int32) for ids in self._piece_ids(text)]
        if add_special and self.add_bos:
            parts.insert(0, np.asarray([self.bos_id], dtype=np.int32))
        if add_special and self.add_eos:
            parts.append(np.asarray([self.eos_id], dtype=np.int32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    def _ids_of(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece_ids in self._piece_ids(text):
            ids.extend(piece_ids)
        return ids

    def _piece_ids(self, text: str) -> Iterator[list[int]]:
        """The text's ids, a piece's at a time: a long text piece by piece (PIECE_CHARS),
        each piece alone in the Rust encoder, so its structures never hold more than one
        piece; a short one whole."""
        if not self._cuts_pieces or len(text) <= PIECE_CHARS + PIECE_SEARCH:
            yield self._encode_batch([text], add_special_tokens=False)[0].ids
            return
        for piece in safe_pieces(text, PIECE_CHARS, PIECE_SEARCH):
            FOREGROUND.wait_quiet(PIECE_YIELD_S)  # a prompt's prefill first (foreground.py)
            yield self._encode_batch([piece], add_special_tokens=False)[0].ids

    def min_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)), without tokenizing: no token covers more
        characters than it has bytes, so the text needs at least its length (less the
        characters the vocabulary drops) / the longest token's bytes. 0 (no bound) for a
        vocabulary that can fold unknown text into one token."""
        if not self._max_piece:
            return 0
        covered = len(text) - sum(text.count(c) for c in self._dropped)
        return -(-covered // self._max_piece)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, special tokens included as their text."""
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def token_text(self, token_id: int) -> str:
        """The vocabulary string of one id, as stored in the GGUF (byte-level alphabet)."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of a vocabulary string, e.g. "<|im_end|>", or None."""
        return self._ids.get(text)

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    """Feed ids one at a time; get back only whole UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer):
        self._bytes = tokenizer._bytes
        # The C incremental decoder holds an incomplete multibyte tail until it completes,
        # and only replaces bytes that can never become valid.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._decoder.decode(self._bytes[token_id])

    def flush(self) -> str:
        """Whatever is left at the end; an unfinished character becomes U+FFFD."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
