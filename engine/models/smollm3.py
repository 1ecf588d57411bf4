"""GGUF `smollm3` (SmolLM3): the llama block (GGUF's permuted Q/K rows, interleaved
RoPE) where every fourth layer (3, 7, 11, ...) applies no RoPE at all ("NoPE"). The
interval is no GGUF key: llama.cpp fixes it at 4 for this architecture, as the
transformers config's default `no_rope_layer_interval` does."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(neox_rope=False, activation="silu", no_rope_interval=4)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
