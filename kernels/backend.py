"""The seam under every model: what a compute backend must implement.

A backend owns weight storage and every operation that touches weights or the KV cache.
The one decoder block (`engine.models._block`) is written against this
interface only, so a new backend (quantised CPU kernels, CuPy on a GPU) is a new class
here and no model file changes. The numpy backend is the reference the others are
tested against.

Arrays are the backend's own (numpy here; CuPy arrays on a GPU): the block only slices,
reshapes and adds them, which both array modules do alike. What crosses back to the
host is one thing: logits, through `to_host`.

Batch invariance is part of the contract: `linear` computes each of its B rows exactly
as it would alone (same bits whatever the other rows are), and `attention_decode` runs
each row over its own slot. Only `linear_prefill` (one sequence's chunk of prompt
tokens, never shared with another request) may use a shape-dependent GEMM.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from kernels import moe
from kernels.kv_types import KV_DTYPES
from kernels.quants import dequantize_rows
from kernels.weights import RopeTable, Weight

Array = Any  # the backend's array type: numpy.ndarray, cupy.ndarray, ...

# What a backend keeps for one matrix type: "dense" wants float32 rows (dequantised at
# load, or memory-mapped from the weight cache); "blocks" keeps the file's bytes as they
# are and computes on them.
DENSE = "dense"
BLOCKS = "blocks"


class Backend(ABC):
    """One compute backend. Stateless apart from its configuration: weights and KV caches
    are objects it hands out, so several models share one backend."""

    name: str  # "numpy", "cuda", ...
    on_accelerator: bool = False  # weights and KV live in device memory
    dtype: np.dtype = np.dtype(np.float32)  # activations and the KV cache
    # linear_prefill computes output row t from x[t] alone, whatever else is in x, for
    # chunks of more than prefill_direct_rows rows (fewer take the `linear` row kernel):
    # then prompt chunks of several sequences may share one pass (models._block.PackedPrefill).
    packs_prefill: bool = False
    prefill_direct_rows: int = 0
    # A decode step can be captured into a CUDA graph and replayed (capture_step; the
    # cuda backend: its kernels never read positions or slots on the host).
    captures_graphs: bool = False
    # The KV types (kernels/kv_types.py) its caches can store: the `kv_dtype` load option.
    kv_dtypes: tuple[str, ...] = KV_DTYPES
    # Its attention takes `sinks` (gpt-oss); a model with sinks is refused where not.
    attention_sinks: bool = False

    # ---- weights ----

    def storage_for(self, qtype: GGMLQuantizationType) -> str:
        """DENSE or BLOCKS: how this backend wants a matrix stored in the file as `qtype`.
        The numpy reference keeps everything dense (float32)."""
        return DENSE

    @abstractmethod
    def dense_weight(self, array: np.ndarray) -> Weight:
        """A matrix (out, in) of float32 values, as prepared at load (host memory, maybe
        memory-mapped); the backend keeps or uploads it as it likes."""

    @abstractmethod
    def block_weight(
        self, blocks: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]
    ) -> Weight:
        """A matrix (out, in) kept in GGUF block layout: `blocks` is (out, bytes per row)
        uint8, exactly the file's bytes."""

    def stacked_weight(self, parts: list[Weight]) -> Weight:
        """Matrices stacked along `out` (q, k and v as one matrix, one matmul). Default:
        one float matrix for float parts; one block matrix when they share a block type
        (block rows are independent, so stacking matrices is stacking their rows); else
        dequantised into one dense matrix. A backend with a kernel per type may keep the
        parts apart instead (kernels.cpu.backend: no copy of the file's bytes)."""
        k = parts[0].shape[1]
        if not any(p.is_blocks for p in parts):  # float values: one float matrix
            return self.dense_weight(np.concatenate([np.asarray(p.data) for p in parts]))
        if len({p.storage for p in parts}) == 1:
            blocks = np.concatenate([p.data for p in parts])
            return self.block_weight(blocks, parts[0].meta["qtype"], (len(blocks), k))
        values = [dequantize_rows(p.data, p.meta["qtype"], np.float32) for p in parts]
        return self.dense_weight(np.concatenate(values))

    @abstractmethod
    def vector(self, array: np.ndarray) -> Array:
        """A small float32 parameter (a norm weight, a bias) in the backend's memory."""

    # ---- the operations of a decoder block ----

    @abstractmethod
    def embed(self, table: Weight, token_ids: np.ndarray) -> Array:
        """Rows `token_ids` of the embedding table: (n, D)."""

    @abstractmethod
    def linear(self, x: Array, w: Weight) -> Array:
        """x (B, K) @ w.T -> (B, N), batch invariant: row b is the same bits whatever else
        is in x (decode)."""

    def argmax_logits(
        self, x: Array, w: Weight, argmax: Sequence[frozenset | None]
    ) -> Array | None:
        """`linear`, where row b wants only its argmax among the ids not in argmax[b] (None:
        the whole row): a backend that can skip the rest returns (B, N) holding linear's
        own value for every id that could be such a row's largest allowed one and -inf
        elsewhere (the argmax and its ties are the full row's). None: no such path here
        (the caller runs `linear`)."""
        return None

    @abstractmethod
    def linear_prefill(self, x: Array, w: Weight) -> Array:
        """x (T, K) @ w.T -> (T, N) for one sequence's prompt chunk (any kernel)."""

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """x * rsqrt(mean(x^2) + eps) * weight over the last axis."""

    @abstractmethod
    def rope_table(
        self,
        n_pos: int,
        dim: int,
        base: float,
        factors: Sequence[float] | None = None,
        attn_factor: float = 1.0,
    ) -> RopeTable:
        """cos/sin tables for positions 0..n_pos; `factors` (dim // 2) divide the
        frequencies and `attn_factor` scales cos and sin (LongRoPE)."""

    @abstractmethod
    def rope(self, x: Array, positions: np.ndarray, table: RopeTable, neox: bool) -> Array:
        """Rotate x (n, H, Dh) at `positions` (n,): adjacent pairs (GGUF llama, whose Q/K
        rows are permuted for it) or the two halves (NeoX: qwen2/3, gemma3)."""

    @abstractmethod
    def glu(self, gate_up: Array, d_ff: int, activation: str) -> Array:
        """act(gate) * up over a fused (n, 2F) gate/up product; activation "silu" or
        "gelu_tanh"; or "swiglu_oai" (gpt-oss: gate and up clamped, then
        (up + 1) * gate * sigmoid(1.702 gate))."""

    @abstractmethod
    def softcap(self, x: Array, cap: float) -> Array:
        """cap * tanh(x / cap)."""

    # ---- attention over the KV cache ----

    @abstractmethod
    def make_kv_cache(
        self,
        n_layer: int,
        n_slots: int,
        n_kv_head: int,
        n_ctx: int,
        head_dim: int,
        kv_dtype: str = "f32",
    ):
        """Per-slot KV storage for `n_slots` sequences of up to `n_ctx` positions, stored
        as `kv_dtype` (one of `kv_dtypes`); attention reads it in that type."""

    @abstractmethod
    def attention_prefill(
        self,
        q: Array,
        k: Array,
        v: Array,
        kv,
        layer: int,
        slot: int,
        start: int,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: Array | None = None,
    ) -> Array:
        """Write k, v (T, Hkv, Dh) at positions start.. of `slot`, then causal grouped-query
        attention of q (T, H, Dh) over positions 0..start+T. `window` > 0 hides keys that
        many or more positions behind the query; `sinks` (H,), where `attention_sinks`:
        a logit per query head added to each softmax's denominator (it takes no value).
        Returns (T, H * Dh)."""

    def attention_prefill_packed(
        self,
        q: Array,
        k: Array,
        v: Array,
        kv,
        layer: int,
        chunks,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: Array | None = None,
    ) -> Array:
        """Several sequences' prompt chunks stacked in rows: chunks are (slot, start, n) in
        row order, each attended as `attention_prefill` attends it alone. Only called where
        `packs_prefill` is set (models._block.PackedPrefill)."""
        raise NotImplementedError(f"the {self.name} backend does not pack prefill chunks")

    @abstractmethod
    def attention_decode(
        self,
        q: Array,
        k: Array,
        v: Array,
        kv,
        layer: int,
        slots: Sequence[int],
        positions: np.ndarray,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: Array | None = None,
    ) -> Array:
        """One new position per row: row b writes k[b], v[b] at positions[b] of slots[b]
        and attends over that slot's own positions. Returns (B, H * Dh); each row
        computed exactly as alone."""

    def mixture(
        self,
        x: Array,
        router_logits: Array,
        expert: Callable[[int, Array], Array],
        segments: Sequence[slice],
        n_used: int,
        gating: str = "softmax",
        norm_topk: bool = True,
        scale: float = 1.0,
    ) -> Array:
        """A mixture-of-experts FFN around its expert products (kernels/moe.py): each row
        of x (n, D) routed by its router logits (n, E) to its `n_used` best experts
        (softmax or sigmoid gating, renormalised with norm_topk, times scale), the rows
        of a segment grouped by expert so `expert(e, rows)` runs once per chosen expert,
        and each row's outputs summed in rank order. The logits come to the host: which
        products run is decided there. Row-wise throughout (batch invariant, given an
        `expert` that is)."""
        return moe.mixture(
            x, self.to_host(router_logits), expert, segments, n_used, gating, norm_topk, scale
        )

    def decode_stack(self, layers: Sequence, hp, spec) -> Callable | None:
        """Optionally, the whole layer stack of a decode step as one compiled call:
        `run(x, slots, positions, kv)` returns x (B, D) through every layer, with
        the bits of the per-op path (`DecoderModel.block`). None (the default): the model
        runs the per-op path. `layers`: the model's LayerWeights; hp, spec: its HParams and
        ArchSpec."""
        return None

    def capture_step(self, step: Callable, bucket: int, width: int | None, scratch_slot: int):
        """`step(inputs, positions, slots)` (a stage's decode step for `bucket` rows)
        captured into a graph; returns replay(inputs, positions, slots) for up to `bucket`
        rows, the bits `step` gives. `width`: None for token ids in, else the hidden
        width. Only where `captures_graphs` (kernels/cuda/graphs.py)."""
        raise NotImplementedError(f"the {self.name} backend captures no graphs")

    def adopt(self, x: Array) -> Array:
        """x, computed by another instance of a backend (the previous stage of a model split
        across dies), as this backend's array: on a GPU, copied onto this backend's die."""
        return x

    # ---- results ----

    @abstractmethod
    def to_host(self, x: Array) -> np.ndarray:
        """A float32 numpy copy (or view) of x: the logits the sampler reads."""
