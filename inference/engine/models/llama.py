"""GGUF `llama` architecture in numpy: RMSNorm, interleaved RoPE, GQA, SwiGLU, tied output."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kernels import numpy_backend as ops
from kernels.kv_cache import KVCache

from ..loading.gguf_file import GGUFFile
from ..loading.weight_cache import WeightCache
from ..types import ModelLoadError
from ._common import DecoderWeights, TensorSource

log = logging.getLogger("pantheon.engine.llama")


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

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> HParams:
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
            d_ff=int(gf.arch_value("feed_forward_length")),
            vocab_size=int(vocab),
            n_ctx_train=int(gf.arch_value("context_length", 2048)),
            rope_base=float(gf.arch_value("rope.freq_base", 10000.0)),
            rope_dim=int(gf.arch_value("rope.dimension_count", head_dim)),
            eps=float(gf.arch_value("attention.layer_norm_rms_epsilon", 1e-5)),
        )


@dataclass
class Layer:
    attn_norm: np.ndarray  # (D,)
    attn_qkv: np.ndarray  # (Dq + 2 Dkv, D): q, k, v rows fused into one matmul
    attn_output: np.ndarray  # (D, Dq)
    ffn_norm: np.ndarray  # (D,)
    ffn_gate_up: np.ndarray  # (2 F, D): gate and up fused
    ffn_down: np.ndarray  # (D, F)
    # Fixed row ranges of each matrix for the batch-invariant decode matmuls.
    chunks: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down"):
            self.chunks[name] = ops.row_chunks(getattr(self, name))


class LlamaModel(DecoderWeights):
    """Weights dequantised to float32 once at load; forward() runs on a KV-cache slot."""

    def __init__(self, gf: GGUFFile, source: TensorSource):
        self.hp = hp = HParams.from_gguf(gf)
        if hp.rope_dim != hp.head_dim:
            raise ModelLoadError(
                f"partial RoPE (dim {hp.rope_dim} of {hp.head_dim}) is not supported"
            )
        load = source.get
        self.tok_embd = load("token_embd.weight")  # (V, D)
        self.layers: list[Layer] = []
        for i in range(hp.n_layer):
            p = f"blk.{i}."
            self.layers.append(
                Layer(
                    attn_norm=load(p + "attn_norm.weight"),
                    attn_qkv=source.fused([p + f"attn_{x}.weight" for x in "qkv"]),
                    attn_output=load(p + "attn_output.weight"),
                    ffn_norm=load(p + "ffn_norm.weight"),
                    ffn_gate_up=source.fused([p + "ffn_gate.weight", p + "ffn_up.weight"]),
                    ffn_down=load(p + "ffn_down.weight"),
                )
            )
        self.output_norm = load("output_norm.weight")
        # Tied embeddings: no output.weight in the file means logits use token_embd.
        output = load("output.weight", optional=True)
        self.output = self.tok_embd if output is None else output
        self.output_chunks = ops.row_chunks(self.output)
        self.rope_cos, self.rope_sin = ops.rope_tables(hp.n_ctx_train, hp.rope_dim, hp.rope_base)

    def forward(
        self, tokens: np.ndarray, start: int, kv: KVCache, slot: int, all_logits: bool = False
    ) -> np.ndarray:
        """Run `tokens` at positions start.. on one slot. Returns logits of the last token (V,),
        or of every token (T, V) with all_logits."""
        hp = self.hp
        T = len(tokens)
        H, Hkv, Dh = hp.n_head, hp.n_kv_head, hp.head_dim
        group = H // Hkv
        Dq, Dkv = H * Dh, Hkv * Dh
        end = start + T
        if end > kv.n_ctx or end > len(self.rope_cos):
            raise ValueError(f"positions {start}..{end} exceed the KV window {kv.n_ctx}")
        cos, sin = self.rope_cos[start:end], self.rope_sin[start:end]
        scale = np.float32(1.0 / np.sqrt(Dh))
        # Causal mask over the keys 0..end for queries start..end.
        mask = np.arange(end)[None, :] > np.arange(start, end)[:, None]  # (T, end)

        x = self.tok_embd[tokens]  # (T, D)
        for li, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.attn_norm, hp.eps)
            qkv = h @ layer.attn_qkv.T  # (T, Dq + 2 Dkv)
            q = ops.apply_rope_interleaved(qkv[:, :Dq].reshape(T, H, Dh), cos, sin)
            k = ops.apply_rope_interleaved(qkv[:, Dq : Dq + Dkv].reshape(T, Hkv, Dh), cos, sin)
            v = qkv[:, Dq + Dkv :].reshape(T, Hkv, Dh)
            kv.write(li, slot, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
            keys, values = kv.view(li, slot, end)  # (Hkv, end, Dh)

            # Query head h reads KV head h // group, as llama.cpp broadcasts GQA.
            qg = q.reshape(T, Hkv, group, Dh).transpose(1, 2, 0, 3)  # (Hkv, group, T, Dh)
            scores = (qg * scale) @ keys[:, None].transpose(0, 1, 3, 2)  # (Hkv, group, T, end)
            scores[..., mask] = -np.inf
            ops.softmax_inplace(scores)
            attn = scores @ values[:, None]  # (Hkv, group, T, Dh)
            attn = attn.transpose(2, 0, 1, 3).reshape(T, Dq)
            x = x + attn @ layer.attn_output.T

            h = ops.rms_norm(x, layer.ffn_norm, hp.eps)
            gate_up = h @ layer.ffn_gate_up.T  # (T, 2F)
            act = ops.silu(gate_up[:, : hp.d_ff]) * gate_up[:, hp.d_ff :]
            x = x + act @ layer.ffn_down.T

        if not all_logits:
            x = x[-1:]
        x = ops.rms_norm(x, self.output_norm, hp.eps)
        logits = x @ self.output.T  # (T, V)
        return logits if all_logits else logits[0]

    def forward_decode(
        self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int], kv: KVCache
    ) -> np.ndarray:
        """One decode step for B sequences in one pass: token b at positions[b] on slot
        slots[b]. Returns logits (B, V).

        Batch invariant: row b's logits are the same bits whatever else is in the batch.
        The matmuls go row by row over fixed weight chunks (ops.linear_rows; a GEMM's
        rows are not guaranteed that), attention runs per row over the row's own KV, and
        everything else is elementwise or reduces along a row.
        """
        hp = self.hp
        B = len(tokens)
        H, Hkv, Dh = hp.n_head, hp.n_kv_head, hp.head_dim
        group = H // Hkv
        Dq, Dkv = H * Dh, Hkv * Dh
        pos = np.asarray(positions, dtype=np.int64)
        if B and (pos.max() >= kv.n_ctx or pos.max() >= len(self.rope_cos)):
            raise ValueError(f"position {pos.max()} exceeds the KV window {kv.n_ctx}")
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]  # (B, Dh / 2)
        scale = np.float32(1.0 / np.sqrt(Dh))

        x = self.tok_embd[np.asarray(tokens, dtype=np.int64)]  # (B, D)
        for li, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.attn_norm, hp.eps)
            qkv = ops.linear_rows(h, layer.attn_qkv, layer.chunks["attn_qkv"])
            q = ops.apply_rope_interleaved(qkv[:, :Dq].reshape(B, H, Dh), cos, sin)
            k = ops.apply_rope_interleaved(qkv[:, Dq : Dq + Dkv].reshape(B, Hkv, Dh), cos, sin)
            v = qkv[:, Dq + Dkv :].reshape(B, Hkv, Dh)
            attn = np.empty((B, Dq), dtype=np.float32)
            for b in range(B):
                slot, p = int(slots[b]), int(pos[b])
                kv.write(li, slot, p, k[b][:, None], v[b][:, None])
                keys, values = kv.view(li, slot, p + 1)  # (Hkv, p + 1, Dh)
                qg = q[b].reshape(Hkv, group, 1, Dh)
                scores = (qg * scale) @ keys[:, None].transpose(0, 1, 3, 2)  # (Hkv, group, 1, p+1)
                ops.softmax_inplace(scores)
                attn[b] = (scores @ values[:, None]).reshape(Dq)
            x = x + ops.linear_rows(attn, layer.attn_output, layer.chunks["attn_output"])

            h = ops.rms_norm(x, layer.ffn_norm, hp.eps)
            gate_up = ops.linear_rows(h, layer.ffn_gate_up, layer.chunks["ffn_gate_up"])
            act = ops.silu(gate_up[:, : hp.d_ff]) * gate_up[:, hp.d_ff :]
            x = x + ops.linear_rows(act, layer.ffn_down, layer.chunks["ffn_down"])

        x = ops.rms_norm(x, self.output_norm, hp.eps)
        return ops.linear_rows(x, self.output, self.output_chunks)  # (B, V)


def load(gf: GGUFFile, progress=None, cache: WeightCache | None = None) -> LlamaModel:
    t0 = time.perf_counter()
    model = LlamaModel(gf, TensorSource(gf, progress, cache))
    log.info(
        "llama weights ready in %.2f s (%.0f MB float32)",
        time.perf_counter() - t0,
        model.weight_bytes / 1e6,
    )
    return model
