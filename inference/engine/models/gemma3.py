"""GGUF `gemma3` in numpy.

What differs from llama: the embedding is scaled by sqrt(D); QK-norm; NeoX RoPE with a
local base (10000) on sliding-window layers and the file's base on global ones; every
sixth layer is global, the others see only the last `sliding_window` positions; norms
after attention and after the FFN as well as before; a tanh-GELU gated FFN; tied output.
The GGUF stores Gemma's RMSNorm weights with the +1 already added, so they apply as is.
Gemma 3 has no logit soft-capping (Gemma 2 had).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels import numpy_backend as ops
from kernels.kv_cache import KVCache

from ..loading.gguf_file import GGUFFile
from ..loading.weight_cache import WeightCache
from ._common import DecoderWeights, TensorSource, attend

SWA_PATTERN = 6  # layer i is global when (i + 1) % 6 == 0, as llama.cpp sets for gemma3
LOCAL_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class HParams:
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_ff: int
    n_ctx_train: int
    rope_base: float
    sliding_window: int
    eps: float

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> HParams:
        d_model = int(gf.arch_value("embedding_length"))
        n_head = int(gf.arch_value("attention.head_count"))
        return cls(
            n_layer=int(gf.arch_value("block_count")),
            d_model=d_model,
            n_head=n_head,
            n_kv_head=int(gf.arch_value("attention.head_count_kv", n_head)),
            head_dim=int(gf.arch_value("attention.key_length", d_model // n_head)),
            d_ff=int(gf.arch_value("feed_forward_length")),
            n_ctx_train=int(gf.arch_value("context_length", 8192)),
            rope_base=float(gf.arch_value("rope.freq_base", 1_000_000.0)),
            sliding_window=int(gf.arch_value("attention.sliding_window", 512)),
            eps=float(gf.arch_value("attention.layer_norm_rms_epsilon", 1e-6)),
        )

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % SWA_PATTERN == 0


@dataclass
class Layer:
    attn_norm: np.ndarray
    attn_qkv: np.ndarray  # (Dq + 2 Dkv, D)
    attn_q_norm: np.ndarray  # (Dh,)
    attn_k_norm: np.ndarray
    attn_output: np.ndarray  # (D, Dq)
    post_attention_norm: np.ndarray
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray  # (2 F, D)
    ffn_down: np.ndarray  # (D, F)
    post_ffw_norm: np.ndarray


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x**3)))


class Gemma3Model(DecoderWeights):
    def __init__(self, gf: GGUFFile, source: TensorSource):
        self.hp = hp = HParams.from_gguf(gf)
        load = source.get
        self.tok_embd = load("token_embd.weight")  # (V, D)
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            self.layers.append(
                Layer(
                    attn_norm=load(p + "attn_norm.weight"),
                    attn_qkv=source.fused([p + f"attn_{x}.weight" for x in "qkv"]),
                    attn_q_norm=load(p + "attn_q_norm.weight"),
                    attn_k_norm=load(p + "attn_k_norm.weight"),
                    attn_output=load(p + "attn_output.weight"),
                    post_attention_norm=load(p + "post_attention_norm.weight"),
                    ffn_norm=load(p + "ffn_norm.weight"),
                    ffn_gate_up=np.concatenate(
                        [load(p + "ffn_gate.weight"), load(p + "ffn_up.weight")]
                    ),
                    ffn_down=load(p + "ffn_down.weight"),
                    post_ffw_norm=load(p + "post_ffw_norm.weight"),
                )
            )
        self.output_norm = load("output_norm.weight")
        output = load("output.weight", optional=True)
        self.output = self.tok_embd if output is None else output
        self.rope_global = ops.rope_tables(hp.n_ctx_train, hp.head_dim, hp.rope_base)
        self.rope_local = ops.rope_tables(hp.n_ctx_train, hp.head_dim, LOCAL_ROPE_BASE)
        self.embed_scale = np.float32(np.sqrt(hp.d_model))

    def forward(self, tokens, start: int, kv: KVCache, slot: int, all_logits: bool = False):
        hp = self.hp
        T = len(tokens)
        H, Hkv, Dh = hp.n_head, hp.n_kv_head, hp.head_dim
        Dq, Dkv = H * Dh, Hkv * Dh
        end = start + T
        if end > kv.n_ctx or end > hp.n_ctx_train:
            raise ValueError(f"positions {start}..{end} exceed the KV window {kv.n_ctx}")
        scale = 1.0 / np.sqrt(Dh)

        x = self.tok_embd[tokens] * self.embed_scale  # (T, D)
        for li, layer in enumerate(self.layers):
            is_global = hp.is_global(li)
            cos, sin = self.rope_global if is_global else self.rope_local
            cos, sin = cos[start:end], sin[start:end]

            h = ops.rms_norm(x, layer.attn_norm, hp.eps)
            qkv = h @ layer.attn_qkv.T
            q = ops.rms_norm(qkv[:, :Dq].reshape(T, H, Dh), layer.attn_q_norm, hp.eps)
            k = ops.rms_norm(qkv[:, Dq : Dq + Dkv].reshape(T, Hkv, Dh), layer.attn_k_norm, hp.eps)
            v = qkv[:, Dq + Dkv :].reshape(T, Hkv, Dh)
            q, k = ops.apply_rope_neox(q, cos, sin), ops.apply_rope_neox(k, cos, sin)
            kv.write(li, slot, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            keys, values = kv.view(li, slot, end)
            window = 0 if is_global else hp.sliding_window
            attn = attend(q, keys, values, start, scale, window) @ layer.attn_output.T
            x = x + ops.rms_norm(attn, layer.post_attention_norm, hp.eps)

            h = ops.rms_norm(x, layer.ffn_norm, hp.eps)
            gate_up = h @ layer.ffn_gate_up.T
            ffn = (gelu_tanh(gate_up[:, : hp.d_ff]) * gate_up[:, hp.d_ff :]) @ layer.ffn_down.T
            x = x + ops.rms_norm(ffn, layer.post_ffw_norm, hp.eps)

        x = ops.rms_norm(x if all_logits else x[-1:], self.output_norm, hp.eps)
        logits = x @ self.output.T
        return logits if all_logits else logits[0]


def load(gf: GGUFFile, progress=None, cache: WeightCache | None = None) -> Gemma3Model:
    return Gemma3Model(gf, TensorSource(gf, progress, cache))
