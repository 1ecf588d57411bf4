"""GGUF `qwen2` in numpy: the llama block with Q/K/V biases and NeoX-style RoPE.

Also serves `qwen3` (see qwen3.py): the same block without biases and with QK-norm, a
per-head RMSNorm of queries and keys before RoPE. Each is optional here, read from the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels import numpy_backend as ops
from kernels.kv_cache import KVCache

from ..loading.gguf_file import GGUFFile
from ..loading.weight_cache import WeightCache
from ._common import DecoderWeights, TensorSource, attend
from .llama import HParams


@dataclass
class Layer:
    attn_norm: np.ndarray  # (D,)
    attn_qkv: np.ndarray  # (Dq + 2 Dkv, D)
    attn_qkv_bias: np.ndarray | None  # (Dq + 2 Dkv,); None without biases (qwen3)
    attn_output: np.ndarray  # (D, Dq)
    ffn_norm: np.ndarray
    ffn_gate_up: np.ndarray  # (2 F, D)
    ffn_down: np.ndarray  # (D, F)
    attn_q_norm: np.ndarray | None = None  # (Dh,) qwen3's QK-norm
    attn_k_norm: np.ndarray | None = None


class Qwen2Model(DecoderWeights):
    def __init__(self, gf: GGUFFile, source: TensorSource):
        self.hp = hp = HParams.from_gguf(gf)
        load = source.get
        self.tok_embd = load("token_embd.weight")
        self.layers = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            names = [p + f"attn_{x}.weight" for x in "qkv"]
            qkv = source.fused(names)
            bias = source.fused_bias([n.replace(".weight", ".bias") for n in names], names)
            self.layers.append(
                Layer(
                    attn_norm=load(p + "attn_norm.weight"),
                    attn_qkv=qkv,
                    attn_qkv_bias=bias,
                    attn_output=load(p + "attn_output.weight"),
                    ffn_norm=load(p + "ffn_norm.weight"),
                    ffn_gate_up=np.concatenate(
                        [load(p + "ffn_gate.weight"), load(p + "ffn_up.weight")]
                    ),
                    ffn_down=load(p + "ffn_down.weight"),
                    attn_q_norm=load(p + "attn_q_norm.weight", optional=True),
                    attn_k_norm=load(p + "attn_k_norm.weight", optional=True),
                )
            )
        self.output_norm = load("output_norm.weight")
        output = load("output.weight", optional=True)
        self.output = self.tok_embd if output is None else output  # tied when absent
        self.rope_cos, self.rope_sin = ops.rope_tables(hp.n_ctx_train, hp.rope_dim, hp.rope_base)

    def forward(self, tokens, start: int, kv: KVCache, slot: int, all_logits: bool = False):
        hp = self.hp
        T = len(tokens)
        H, Hkv, Dh = hp.n_head, hp.n_kv_head, hp.head_dim
        Dq, Dkv = H * Dh, Hkv * Dh
        end = start + T
        if end > kv.n_ctx or end > len(self.rope_cos):
            raise ValueError(f"positions {start}..{end} exceed the KV window {kv.n_ctx}")
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]

        x = self.tok_embd[tokens]  # (T, D)
        for li, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.attn_norm, hp.eps)
            qkv = h @ layer.attn_qkv.T
            if layer.attn_qkv_bias is not None:
                qkv += layer.attn_qkv_bias
            q = qkv[:, :Dq].reshape(T, H, Dh)
            k = qkv[:, Dq : Dq + Dkv].reshape(T, Hkv, Dh)
            if layer.attn_q_norm is not None:
                q = ops.rms_norm(q, layer.attn_q_norm, hp.eps)
                k = ops.rms_norm(k, layer.attn_k_norm, hp.eps)
            q = ops.apply_rope_neox(q, cos, sin)
            k = ops.apply_rope_neox(k, cos, sin)
            v = qkv[:, Dq + Dkv :].reshape(T, Hkv, Dh)
            kv.write(li, slot, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            keys, values = kv.view(li, slot, end)
            x = x + attend(q, keys, values, start, 1.0 / np.sqrt(Dh)) @ layer.attn_output.T

            h = ops.rms_norm(x, layer.ffn_norm, hp.eps)
            gate_up = h @ layer.ffn_gate_up.T
            x = x + (ops.silu(gate_up[:, : hp.d_ff]) * gate_up[:, hp.d_ff :]) @ layer.ffn_down.T

        x = ops.rms_norm(x if all_logits else x[-1:], self.output_norm, hp.eps)
        logits = x @ self.output.T
        return logits if all_logits else logits[0]


def load(gf: GGUFFile, progress=None, cache: WeightCache | None = None) -> Qwen2Model:
    return Qwen2Model(gf, TensorSource(gf, progress, cache))
