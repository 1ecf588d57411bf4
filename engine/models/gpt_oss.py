"""GGUF `gpt-oss` (OpenAI's gpt-oss-20b and -120b; this module's name spells the dash as
an underscore). What differs from qwen3moe:

- attention sinks: a learned logit per query head (`attn_sinks`) joins each softmax's
  denominator and takes no value, so a head may attend to "nothing";
- biases on q/k/v and the attention output, on the router and on every expert;
- layers alternate a sliding window (even layers see the last `attention.sliding_window`
  positions) and full attention;
- routing: the top k of the router logits, then a softmax over those k only;
- the experts' SwiGLU is clamped: gate at most 7, up within [-7, 7], and
  out = (up + 1) * gate * sigmoid(1.702 * gate);
- YaRN RoPE (`rope.scaling.*`), NeoX rotation, no QK-norm; the FFN's pre-norm is stored
  as `post_attention_norm`.

Real files store the experts as MXFP4; the chat template is the file's own (jinja), and
the "harmony" channels of its answers are split by engine/decoding/harmony.py.
"""

from __future__ import annotations

from ._block import ArchSpec, DecoderModel, load_decoder
from ._moe import MoeSpec
from ._yarn import read_yarn


def _yarn(gf) -> dict:
    # transformers' gpt-oss config sets `truncate: False`: the ramp's ends stay fractional.
    return read_yarn(gf, truncate=False)


SPEC = ArchSpec(
    neox_rope=True,
    activation="swiglu_oai",
    moe=MoeSpec(gating="softmax_topk", norm_topk=False),
    qkv_bias=True,
    attn_sinks=True,
    ffn_norm_name="post_attention_norm",
    swa_pattern=2,  # layer i is global when (i + 1) % 2 == 0, as llama.cpp sets for gpt-oss
    default_ctx=131072,
    default_rope_base=150000.0,
    default_eps=1e-5,
    read_file=_yarn,
)


def load(gf, progress=None, cache=None, backend=None, quantize=False) -> DecoderModel:
    return load_decoder(gf, SPEC, progress, cache, backend, quantize)
