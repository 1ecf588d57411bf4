"""GGUF `olmo2` (OLMo 2): no RMSNorm before attention or the FFN; instead one after each
(`post_attention_norm`, `post_ffw_norm`) on the branch output before its residual add.
Queries and keys are RMS-normed over the whole projection (all heads at once, weights
of width H*Dh and Hkv*Dh) before NeoX RoPE. SwiGLU FFN, untied output."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder

SPEC = ArchSpec(
    neox_rope=True,
    activation="silu",
    qk_norm="required",
    qk_norm_full=True,
    pre_norms=False,
    sandwich_norms=True,
    default_eps=1e-6,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
