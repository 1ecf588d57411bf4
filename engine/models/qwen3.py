"""GGUF `qwen3`: the qwen2 block without Q/K/V biases, with QK-norm (a per-head RMSNorm of
queries and keys before RoPE); head_dim comes from `attention.key_length`."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(neox_rope=True, activation="silu", qk_norm="required")


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
