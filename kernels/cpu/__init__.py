"""The compiled CPU kernels (the `kernels._cpu` extension, built from kernels/cpu/*.c):
`load_extension` is the one place that imports it; backend.py computes with it, text.py
lends the tokenizer its SentencePiece split helper."""

from __future__ import annotations


def load_extension():
    """The compiled module, or None when it was not built (the caller says so)."""
    try:
        from kernels import _cpu
    except ImportError:
        return None
    return _cpu
