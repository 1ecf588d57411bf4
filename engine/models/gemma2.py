"""GGUF `gemma2`.

The gemma3 block without QK-norm: embeddings scaled by sqrt(D); RMSNorm before and after
attention and the FFN; a tanh-GELU gated FFN; NeoX RoPE with one base; every other
layer (0, 2, 4, ...) sees only the last `attention.sliding_window` positions. What
Gemma 3 dropped: attention scores soft-capped, cap * tanh(s / cap), with
`attn_logit_softcapping`, and the logits with `final_logit_softcapping`. The score scale
is 1/sqrt(head_dim), except for the 27B (46 layers), whose query_pre_attn_scalar is
d_model / n_head, as llama.cpp decides. The GGUF's norm weights include Gemma's +1.
"""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder


def _caps(gf) -> dict:
    options = {
        "attn_softcap": float(gf.arch_value("attn_logit_softcapping", 50.0) or 0.0),
        "final_softcap": float(gf.arch_value("final_logit_softcapping", 30.0) or 0.0),
    }
    if int(gf.arch_value("block_count")) == 46:
        n_head = int(gf.arch_value("attention.head_count"))
        options["attention_scale"] = (int(gf.arch_value("embedding_length")) / n_head) ** -0.5
    return options


SPEC = ArchSpec(
    neox_rope=True,
    activation="gelu_tanh",
    sandwich_norms=True,
    embed_scale=True,
    swa_pattern=2,  # layer i is global when (i + 1) % 2 == 0, as llama.cpp sets for gemma2
    default_ctx=8192,
    default_eps=1e-6,
    read_file=_caps,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
