"""GGUF `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (QK-norm, NeoX RoPE,
no Q/K/V biases) with a mixture-of-experts FFN on every layer — a softmax router over
`expert_count` experts, the top `expert_used_count` renormalised to sum to 1 (as llama.cpp
and transformers' `norm_topk_prob` do), no shared expert."""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder
from ._moe import MoeSpec

SPEC = ArchSpec(
    neox_rope=True,
    activation="silu",
    qk_norm="required",
    moe=MoeSpec(gating="softmax", norm_topk=True),
    default_rope_base=1_000_000.0,
    default_eps=1e-6,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
