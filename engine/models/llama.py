"""GGUF `llama` (SmolLM2 and other llama-style files): RMSNorm, GQA, SwiGLU, tied output
when the file has no output.weight, and interleaved RoPE — GGUF stores llama's Q/K rows
permuted for rotating adjacent pairs."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(neox_rope=False, activation="silu")


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
