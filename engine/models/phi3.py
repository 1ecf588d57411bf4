"""GGUF `phi3` (Phi-3, Phi-3.5-mini, Phi-4-mini): RMSNorm, NeoX RoPE, Q/K/V stored as one
fused `attn_qkv` matrix, and gate and up as one `ffn_up` of twice the FFN width (gate
rows first). Files converted from a LongRoPE checkpoint carry `rope_factors_short` and
`rope_factors_long` (per-frequency divisors of the RoPE wavelengths) with
`rope.scaling.original_context_length` and `rope.scaling.attn_factor` (a scale of cos
and sin): the short factors serve contexts within the original length, the long ones
longer contexts, as llama.cpp chooses by the served context. Phi-4-mini rotates only the
first `rope.dimension_count` values of each head (partial RoPE)."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder


def _rope_factors(gf) -> dict:
    if not gf.has_tensor("rope_factors_short.weight"):
        return {}
    long = "rope_factors_long.weight"
    short = tuple(float(f) for f in gf.load_f32("rope_factors_short.weight").ravel())
    return {
        "rope_factors_short": short,
        "rope_factors_long": tuple(float(f) for f in gf.load_f32(long).ravel())
        if gf.has_tensor(long)
        else (),
        "rope_orig_ctx": int(gf.arch_value("rope.scaling.original_context_length", 0) or 0),
        "rope_attn_factor": float(gf.arch_value("rope.scaling.attn_factor", 1.0) or 1.0),
    }


SPEC = ArchSpec(
    neox_rope=True,
    activation="silu",
    partial_rope=True,
    default_ctx=4096,
    read_file=_rope_factors,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
