"""The compiled kernels' help for the tokenizer (engine/text/tokenizer.py, through the
seam: kernels.compiled_spm_splits): every split of SentencePiece pieces into two
vocabulary pieces, in C (gemma3's 262k pieces have ~1.2M cuts)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernels.cpu import load_extension

# (piece index, left id, right id) of every split, as three int64 arrays.
SplitRows = tuple[np.ndarray, np.ndarray, np.ndarray]
SplitFunction = Callable[[list[str], list[bool], dict[str, int]], SplitRows]


def compiled_spm_splits() -> SplitFunction | None:
    """`splits(tokens, normal, vocab)`: the rows of every split of each piece flagged in
    `normal` into two pieces of `vocab`, in piece then cut order. None where the compiled
    kernels were not built (or were built without the helper): the caller splits in
    Python, to the same rows."""
    ext = load_extension()
    if ext is None or not hasattr(ext, "spm_pairs"):
        return None

    def splits(tokens: list[str], normal: list[bool], vocab: dict[str, int]) -> SplitRows:
        owner, left, right = (
            np.frombuffer(b, dtype=np.int64) for b in ext.spm_pairs(tokens, normal, vocab)
        )
        return owner, left, right

    return splits
