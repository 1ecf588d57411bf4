"""GGUF `qwen2`: the llama block with Q/K/V biases and NeoX-style RoPE (unpermuted rows).

QK-norm is read when the file has it (qwen3.py declares it required and no biases)."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(neox_rope=True, activation="silu", qkv_bias=True, qk_norm="optional")


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
