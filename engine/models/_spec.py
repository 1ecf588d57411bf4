"""What an architecture declares (`ArchSpec`), the hyper-parameters read from its file
(`HParams`) and one layer's weights as the backend holds them (`LayerWeights`): the data
the shared block (`_block.py`) runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernels.weights import RopeTable, Weight

from ..loading.gguf_file import GGUFFile
from ._moe import MoeSpec


@dataclass(frozen=True)
class ArchSpec:
    """What one architecture declares; everything else is the shared block."""

    neox_rope: bool  # rotate halves (qwen2/3, gemma3), not adjacent pairs (GGUF llama)
    activation: str = "silu"  # of the gated FFN: "silu" or "gelu_tanh"
    moe: MoeSpec | None = None  # a mixture-of-experts FFN on every layer (models/_moe.py)
    qkv_bias: bool = False  # q/k/v biases, read when the file has them (qwen2)
    qk_norm: str = "none"  # per-head RMSNorm of q and k: "none", "optional", "required"
    sandwich_norms: bool = False  # gemma3: RMSNorm after attention and after the FFN too
    embed_scale: bool = False  # gemma3: embeddings times sqrt(d_model)
    swa_pattern: int = 0  # > 0: layer i is global when (i + 1) % swa_pattern == 0, else sliding
    local_rope_base: float = 0.0  # RoPE base of sliding-window layers (0: the file's base)
    attn_softcap: float = 0.0  # > 0: scores = cap * tanh(scores / cap) (gemma2-style)
    final_softcap: float = 0.0  # the same on the logits
    attn_sinks: bool = False  # gpt-oss: a sink logit per head in each softmax, an output bias
    ffn_norm_name: str = "ffn_norm"  # the FFN's pre-norm tensor (gpt-oss: post_attention_norm)
    # Defaults for metadata a file may omit.
    default_ctx: int = 2048
    default_rope_base: float = 10000.0
    default_eps: float = 1e-5
    partial_rope: bool = False  # rope.dimension_count < head_dim: rotate only the first dims
    pre_norms: bool = True  # RMSNorm before attention and the FFN (olmo2: post-norms only)
    qk_norm_full: bool = False  # olmo2: q/k RMSNorm over the whole projection, not per head
    no_rope_interval: int = 0  # > 0: layer i has no RoPE when (i + 1) % interval == 0 (smollm3)
    attention_scale: float = 0.0  # > 0: the score scale instead of 1/sqrt(head_dim)
    embedding_multiplier: float = 0.0  # > 0: embeddings times this (granite)
    residual_multiplier: float = 0.0  # > 0: each branch's output times this before its add
    logit_divisor: float = 0.0  # > 0: logits divided by this (granite's logit_scale)
    # LongRoPE (phi3): per-frequency divisors of the RoPE wavelengths, `short` for served
    # contexts within rope_orig_ctx, `long` beyond it; cos/sin times rope_attn_factor.
    rope_factors_short: tuple[float, ...] = ()
    rope_factors_long: tuple[float, ...] = ()
    rope_orig_ctx: int = 0
    rope_attn_factor: float = 1.0
    # What a file sets for its architecture (soft-caps, multipliers, RoPE factors), read
    # into a per-file copy of the spec (`for_file`); None: the declaration is complete.
    read_file: Callable[[GGUFFile], dict] | None = None

    def for_file(self, gf: GGUFFile) -> ArchSpec:
        if self.read_file is None:
            return self
        return dataclasses.replace(self, read_file=None, **self.read_file(gf))

    @property
    def fuses_decode(self) -> bool:
        """Whether a backend's one-call decode stack (`Backend.decode_stack`) can run this
        block: it does pre-norms, per-head q/k norms, RoPE on every layer and the plain
        score scale, nothing of the options after those."""
        return (
            self.pre_norms
            and not self.qk_norm_full
            and not self.no_rope_interval
            and not self.attention_scale
            and not self.embedding_multiplier
            and not self.residual_multiplier
            and not self.rope_factors_long  # chosen per KV cache (models/_block.py)
            and not self.attn_sinks
        )


@dataclass(frozen=True)
class HParams:
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    vocab_size: int
    n_ctx_train: int
    rope_base: float
    rope_dim: int
    eps: float
    sliding_window: int = 0

    @classmethod
    def from_gguf(cls, gf: GGUFFile, spec: ArchSpec) -> HParams:
        d_model = int(gf.arch_value("embedding_length"))
        n_head = int(gf.arch_value("attention.head_count"))
        head_dim = int(gf.arch_value("attention.key_length", d_model // n_head))
        vocab = gf.arch_value("vocab_size")
        if vocab is None:
            vocab = len(gf.metadata.get("tokenizer.ggml.tokens", ()))
        return cls(
            n_layer=int(gf.arch_value("block_count")),
            d_model=d_model,
            n_head=n_head,
            n_kv_head=int(gf.arch_value("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            d_ff=int(gf.arch_value("feed_forward_length", 0 if spec.moe else None)),
            vocab_size=int(vocab),
            n_ctx_train=int(gf.arch_value("context_length", spec.default_ctx)),
            rope_base=float(gf.arch_value("rope.freq_base", spec.default_rope_base)),
            rope_dim=int(gf.arch_value("rope.dimension_count", head_dim)),
            eps=float(gf.arch_value("attention.layer_norm_rms_epsilon", spec.default_eps)),
            sliding_window=int(gf.arch_value("attention.sliding_window", 512))
            if spec.swa_pattern
            else 0,
        )

    def is_global(self, layer: int, spec: ArchSpec) -> bool:
        return not spec.swa_pattern or (layer + 1) % spec.swa_pattern == 0

    def has_rope(self, layer: int, spec: ArchSpec) -> bool:
        return not spec.no_rope_interval or (layer + 1) % spec.no_rope_interval != 0


@dataclass
class LayerWeights:
    attn_norm: Any  # (D,); None without pre-norms (olmo2)
    attn_qkv: Weight  # (Dq + 2 Dkv, D): q, k, v rows fused into one matmul
    attn_output: Weight  # (D, Dq)
    ffn_norm: Any
    ffn_gate_up: Weight  # (2 F, D): gate and up fused
    ffn_down: Weight  # (D, F)
    rope: RopeTable | None  # this layer's table (gemma3: local or global base); None: no RoPE
    window: int = 0  # > 0: sliding-window layer
    attn_qkv_bias: Any = None  # (Dq + 2 Dkv,)
    attn_q_norm: Any = None  # (Dh,)
    attn_k_norm: Any = None
    post_attention_norm: Any = None  # (D,)
    post_ffw_norm: Any = None
    attn_output_bias: Any = None  # (D,)
    attn_sinks: Any = None  # (H,)
    # models._moe.MoeWeights: router and experts in place of the FFN (ffn_gate_up and
    # ffn_down are None then)
    moe: Any = None
