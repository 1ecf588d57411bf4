"""GGUF `granite` (IBM Granite 3.x dense): the llama block (GGUF's permuted Q/K rows,
interleaved RoPE) with four multipliers from the file — embeddings times
`embedding_scale`, each attention and FFN output times `residual_scale` before its
residual add, scores times `attention.scale` (instead of 1/sqrt(head_dim)), and logits
divided by `logit_scale` — as llama.cpp's granite graph applies them."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder


def _multipliers(gf) -> dict:
    def value(key: str) -> float:
        return float(gf.arch_value(key, 0.0) or 0.0)

    return {
        "embedding_multiplier": value("embedding_scale"),
        "residual_multiplier": value("residual_scale"),
        "attention_scale": value("attention.scale"),
        "logit_divisor": value("logit_scale"),
    }


SPEC = ArchSpec(neox_rope=False, activation="silu", read_file=_multipliers)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
