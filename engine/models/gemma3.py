"""GGUF `gemma3`.

What differs from llama: the embedding is scaled by sqrt(D); QK-norm; NeoX RoPE with a
local base (10000) on sliding-window layers and the file's base on global ones; every
sixth layer is global, the others see only the last `sliding_window` positions; norms
after attention and after the FFN as well as before; a tanh-GELU gated FFN; tied output.
The GGUF stores Gemma's RMSNorm weights with the +1 already added, so they apply as is.
Gemma 3 has no logit soft-capping (Gemma 2 had).
"""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(
    neox_rope=True,
    activation="gelu_tanh",
    qk_norm="required",
    sandwich_norms=True,
    embed_scale=True,
    swa_pattern=6,  # layer i is global when (i + 1) % 6 == 0, as llama.cpp sets for gemma3
    local_rope_base=10000.0,
    default_ctx=8192,
    default_rope_base=1_000_000.0,
    default_eps=1e-6,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
