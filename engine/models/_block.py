"""The one decoder block and forward every architecture shares.

An architecture file declares what makes it different (an `ArchSpec` and how its
hyper-parameters are read); this module turns the GGUF's tensors into `LayerWeights`
through the chosen backend and runs them. Prefill (one sequence's chunk of prompt
tokens) and batched decode (one new token for each of B sequences) go through the same
`block`: they differ only in their `Pass` — which matmul the backend uses (a GEMM for a
chunk, the batch-invariant row kernel for decode) and how attention reads the KV cache.

No array math on weights happens here: every such operation is a backend call
(kernels.backend.Backend). What stays here is slicing, reshaping and residual adds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from kernels import kv_types
from kernels.backend import Backend
from kernels.weights import RopeTable, Weight

from ..loading.gguf_file import GGUFFile
from ..loading.tensors import TensorSource
from ..types import ModelLoadError
from ._moe import MoeParams, load_moe
from ._passes import Decode, PackedPrefill, Prefill
from ._spec import ArchSpec, HParams, LayerWeights

__all__ = ["ArchSpec", "DecoderModel", "HParams", "LayerWeights", "load_decoder"]


class DecoderModel:
    """A decoder-only transformer: weights held by `backend`, run by the shared block.

    `layers` (default: all) makes it one stage of a model split across dies
    (models/_pipeline.py): it holds only those layers, its KV cache only theirs; the stage
    holding layer 0 embeds tokens, the one holding the last layer computes logits, and
    every other entry point takes and returns hidden states (rows, D) instead."""

    def __init__(
        self, gf: GGUFFile, spec: ArchSpec, source: TensorSource, layers: range | None = None
    ):
        self.spec = spec = spec.for_file(gf)
        self.backend = be = source.backend
        self.hp = hp = HParams.from_gguf(gf, spec)
        if spec.attn_sinks and not be.attention_sinks:
            raise ModelLoadError(
                f"{gf.architecture}: the {be.name} backend's attention has no sinks "
                "(the cpu and numpy backends have them)"
            )
        if hp.rope_dim != hp.head_dim and not spec.partial_rope:
            raise ModelLoadError(
                f"partial RoPE (dim {hp.rope_dim} of {hp.head_dim}) is not supported"
            )
        rope_global = self._rope_table(spec.rope_factors_short)
        rope_local = rope_global
        if spec.local_rope_base:
            rope_local = be.rope_table(hp.n_ctx_train, hp.rope_dim, spec.local_rope_base)
        self.rope_tables = [rope_global] if rope_local is rope_global else [rope_global, rope_local]

        layers = range(hp.n_layer) if layers is None else layers
        if not 0 <= layers.start < layers.stop <= hp.n_layer or layers.step != 1:
            raise ValueError(f"layers {layers} of a {hp.n_layer}-layer model")
        self.layer_range = layers
        self.embeds = layers.start == 0  # tokens in
        self.heads = layers.stop == hp.n_layer  # logits out
        # The embedding table on the stage that embeds, and on the one that computes
        # logits with it (tied embeddings): a split model may hold it twice.
        tied = not source.has("output.weight")
        self.tok_embd = (
            source.matrix("token_embd.weight") if self.embeds or (self.heads and tied) else None
        )
        self.layers: list[LayerWeights] = []
        moe = MoeParams.from_gguf(gf, spec.moe) if spec.moe else None
        for i in layers:
            p = f"blk.{i}."
            qkv_names = [p + f"attn_{x}.weight" for x in "qkv"]
            if source.has(p + "attn_qkv.weight"):  # stored fused already (phi3)
                qkv_names = [p + "attn_qkv.weight"]
            gate_up_names = [p + "ffn_gate.weight", p + "ffn_up.weight"]
            if not source.has(gate_up_names[0]):  # phi3: ffn_up holds gate then up rows
                gate_up_names = gate_up_names[1:]
            is_global = hp.is_global(i, spec)
            ffn_gate_up = ffn_down = None  # an MoE layer has experts instead (below)
            if moe is None:
                ffn_gate_up = source.matrix(gate_up_names)
                ffn_down = source.matrix(p + "ffn_down.weight")
            layer = LayerWeights(
                attn_norm=source.vector(p + "attn_norm.weight") if spec.pre_norms else None,
                attn_qkv=source.matrix(qkv_names),
                attn_output=source.matrix(p + "attn_output.weight"),
                ffn_norm=source.vector(p + f"{spec.ffn_norm_name}.weight")
                if spec.pre_norms
                else None,
                ffn_gate_up=ffn_gate_up,
                ffn_down=ffn_down,
                rope=(rope_global if is_global else rope_local) if hp.has_rope(i, spec) else None,
                window=0 if is_global else hp.sliding_window,
            )
            if spec.qkv_bias and len(qkv_names) == 3:
                layer.attn_qkv_bias = source.fused_bias(
                    [n.replace(".weight", ".bias") for n in qkv_names], qkv_names
                )
            if spec.qk_norm != "none":
                optional = spec.qk_norm == "optional"
                layer.attn_q_norm = source.vector(p + "attn_q_norm.weight", optional)
                layer.attn_k_norm = source.vector(p + "attn_k_norm.weight", optional)
            if spec.attn_sinks:
                layer.attn_sinks = source.vector(p + "attn_sinks.weight")
                layer.attn_output_bias = source.vector(p + "attn_output.bias", optional=True)
            if moe is not None:
                layer.moe = load_moe(source, p, moe)
            if spec.sandwich_norms:
                layer.post_attention_norm = source.vector(p + "post_attention_norm.weight")
                layer.post_ffw_norm = source.vector(p + "post_ffw_norm.weight")
            self.layers.append(layer)
        self.output_norm = self.output = None
        if self.heads:
            self.output_norm = source.vector("output_norm.weight")
            # Tied embeddings: no output.weight in the file means logits use token_embd.
            output = source.matrix("output.weight", optional=True)
            self.output = self.tok_embd if output is None else output
        self.embed_scale = be.dtype.type(math.sqrt(hp.d_model)) if spec.embed_scale else None
        if spec.embedding_multiplier:
            self.embed_scale = be.dtype.type(spec.embedding_multiplier)
        self.residual_scale = (
            be.dtype.type(spec.residual_multiplier) if spec.residual_multiplier else None
        )
        self.attn_scale = spec.attention_scale or 1.0 / math.sqrt(hp.head_dim)
        # Tensor types dequantised at load because the backend has no kernel for them
        # (the reference numpy backend dequantises everything by design: not a fallback).
        self.fallback_types = {} if be.name == "numpy" else dict(source.fallback)
        # The whole decode stack as one compiled call where the backend has one (bitwise
        # the per-op `block`; tests compare the two), else None.
        self.decode_stack = be.decode_stack(self.layers, hp, spec) if spec.fuses_decode else None
        # LongRoPE: the table of the long factors, for KV caches longer than the original
        # training context (as llama.cpp chooses by the served context); the layers hold
        # the short one.
        self.long_rope = None
        if spec.rope_factors_long and spec.rope_orig_ctx:
            self.long_rope = self._rope_table(spec.rope_factors_long)

    def _rope_table(self, factors: tuple[float, ...]) -> RopeTable:
        hp, spec = self.hp, self.spec
        if not factors:
            return self.backend.rope_table(hp.n_ctx_train, hp.rope_dim, hp.rope_base)
        return self.backend.rope_table(
            hp.n_ctx_train, hp.rope_dim, hp.rope_base, factors, spec.rope_attn_factor
        )

    # ---- what the service asks of a model ----

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights this model holds in its backend's memory."""
        matrices = {id(w): w for w in (self.tok_embd, self.output) if w is not None}
        vectors = [] if self.output_norm is None else [self.output_norm]
        for layer in self.layers:
            for value in vars(layer).values():
                if isinstance(value, Weight):
                    matrices[id(value)] = value
                elif value is not None and not isinstance(value, (RopeTable, int)):
                    vectors.append(value)
        return int(sum(w.nbytes for w in matrices.values()) + sum(v.nbytes for v in vectors))

    # The KV cache's storage type (kernels/kv_types.py; the `kv_dtype` load option).
    kv_dtype = kv_types.DEFAULT_KV_DTYPE

    def use_kv_dtype(self, kv_dtype: str) -> None:
        """Keep this model's KV caches (made from now on, unless `make_kv_cache` names
        another) as `kv_dtype`; ValueError when it is no KV type, or the head size or the
        backend cannot store it."""
        kv_dtype = kv_types.check_kv_dtype(kv_dtype)
        problem = kv_types.fits(kv_dtype, self.hp.head_dim)
        if problem is None and kv_dtype not in self.backend.kv_dtypes:
            problem = (
                f"kv_dtype {kv_dtype}: the {self.backend.name} backend keeps its KV cache "
                f"as {' or '.join(self.backend.kv_dtypes)} only"
            )
        if problem:
            raise ValueError(problem)
        self.kv_dtype = kv_dtype

    def make_kv_cache(self, n_slots: int, n_ctx: int, kv_dtype: str | None = None):
        """A KV cache for this model's layers, stored as `kv_dtype` (None: the model's)."""
        hp = self.hp
        n_layer = len(self.layers)
        return self.backend.make_kv_cache(
            n_layer, n_slots, hp.n_kv_head, n_ctx, hp.head_dim, kv_dtype or self.kv_dtype
        )

    def forward(self, tokens, start: int, kv, slot: int, all_logits: bool = False) -> np.ndarray:
        """Run `tokens` at positions start.. on one slot (a prompt chunk). Returns logits of
        the last token (V,), or of every token (T, V) with all_logits."""
        T = len(tokens)
        self._check_window(start, start + T, kv)
        step = Prefill(self.backend, kv, slot, start, T)
        x = self._layers(self._embed(tokens), step)
        if not self.heads:  # a stage before the last: every row's hidden state goes on
            return x
        if not all_logits:
            x = x[-1:]
        logits = self._logits(x, step)
        return logits if all_logits else logits[0]

    def _check_window(self, start: int, end: int, kv) -> None:
        if end > kv.n_ctx or end > len(self.rope_tables[0]):
            raise ValueError(f"positions {start}..{end} exceed the KV window {kv.n_ctx}")

    @property
    def packs_prefill(self) -> bool:
        """Whether `forward_packed` gives each chunk its own `forward`'s bits here."""
        return bool(getattr(self.backend, "packs_prefill", False))

    def packable(self, n_tokens: int) -> bool:
        """A chunk of n_tokens may join a packed pass (see PackedPrefill)."""
        return self.packs_prefill and n_tokens > self.backend.prefill_direct_rows

    def forward_packed(self, chunks: Sequence[tuple[Sequence[int], int, int]], kv) -> list:
        """Several sequences' prompt chunks (tokens, start, slot) in one pass; returns each
        chunk's last-token logits (V,), the bits `forward` gives it alone. Every chunk must
        be `packable`."""
        spans = []
        for tokens, start, slot in chunks:
            if not self.packable(len(tokens)):
                raise ValueError(f"a chunk of {len(tokens)} tokens cannot be packed")
            self._check_window(start, start + len(tokens), kv)
            spans.append((int(slot), int(start), len(tokens)))
        step = PackedPrefill(self.backend, kv, spans)
        x = self._layers(self._embed([t for tokens, _, _ in chunks for t in tokens]), step)
        last = np.asarray(list(itertools.accumulate(n for _, _, n in spans)), dtype=np.int64) - 1
        # Alone, a chunk's one last row goes through the backend's row kernel (one row is
        # under prefill_direct_rows); `linear` is that kernel and batch invariant.
        rows = Decode(self.backend, kv, [s for s, _, _ in spans], step.positions[last])
        return list(self._logits(x[last], rows))

    def hidden_states(self, tokens, start: int, kv, slot: int) -> np.ndarray:
        """The final-normed hidden states (T, D) of a prompt chunk at positions start.. on
        one slot (its K/V written as `forward` writes them): what embeddings pool. Run a
        whole token list chunk by chunk on a scratch cache (`make_kv_cache(1, len)`) to
        keep no KV."""
        T = len(tokens)
        self._check_window(start, start + T, kv)
        step = Prefill(self.backend, kv, slot, start, T)
        x = self._layers(self._embed(tokens), step)
        if not self.heads:
            return x
        return self.backend.to_host(self.backend.rms_norm(x, self.output_norm, self.hp.eps))

    def forward_decode(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        kv,
        keep_on_device: bool = False,
        argmax: Sequence[frozenset | None] | None = None,
    ) -> np.ndarray:
        """One decode step for B sequences in one pass: token b at positions[b] on slot
        slots[b]. Returns logits (B, V): on the host, or with keep_on_device as the
        backend's array (on a GPU they stay there: the sampler runs there too,
        decoding/device_sampling.py, and only the chosen tokens come back).

        `argmax[b]`, where not None, says row b wants only its argmax among the ids not in
        that set (greedy: DecodeState.argmax_bans): its row may then hold the exact logit
        of every id that could be that argmax and -inf elsewhere (Backend.argmax_logits).

        Batch invariant: row b's logits are the same bits whatever else is in the batch
        (the backend's `linear` and `attention_decode` promise it per row; everything else
        is elementwise or reduces along a row)."""
        pos = np.asarray(positions, dtype=np.int64)
        self.check_positions(pos, kv)
        return self.decode_rows(tokens, pos, slots, kv, keep_on_device, argmax)

    def check_positions(self, positions: np.ndarray, kv) -> None:
        """A decode step's positions fit the KV window and the RoPE table."""
        top = positions.max() if len(positions) else 0
        if top >= kv.n_ctx or top >= len(self.rope_tables[0]):
            raise ValueError(f"position {top} exceeds the KV window {kv.n_ctx}")

    def decode_rows(self, tokens, positions, slots, kv, keep_on_device=False, argmax=None):
        """forward_decode past its checks, its inputs passed on as given: host arrays, or
        the backend's own arrays (a captured CUDA graph's input buffers: nothing here
        reads them on the host, so the step can be captured; kernels/cuda/graphs.py).
        A stage before the last takes and returns hidden states instead."""
        step = Decode(self.backend, kv, slots, positions)
        x = self._embed(tokens)
        if self.decode_stack is None:
            x = self._layers(x, step)
        else:
            x = self.decode_stack(x, slots, positions, kv)
        return self._logits(x, step, keep_on_device, argmax)

    # ---- the shared block ----

    def _embed(self, tokens):
        if not self.embeds:  # a later stage: the previous stage's hidden states
            return self.backend.adopt(tokens)
        if isinstance(tokens, list | tuple | np.ndarray):
            tokens = np.asarray(tokens, dtype=np.int64)  # else the backend's own ids array
        x = self.backend.embed(self.tok_embd, tokens)  # (n, D)
        return x if self.embed_scale is None else x * self.embed_scale

    def _layers(self, x, step):
        for li, layer in enumerate(self.layers):
            x = self.block(x, li, layer, step)
        return x

    def block(self, x, li: int, layer: LayerWeights, step: Prefill | PackedPrefill | Decode):
        """One decoder layer over n rows (n prompt tokens, or one token per sequence)."""
        be, hp, spec = self.backend, self.hp, self.spec
        n = x.shape[0]
        H, Hkv, Dh = hp.n_head, hp.n_kv_head, hp.head_dim
        Dq, Dkv = H * Dh, Hkv * Dh

        h = x if layer.attn_norm is None else be.rms_norm(x, layer.attn_norm, hp.eps)
        qkv = step.linear(h, layer.attn_qkv)  # (n, Dq + 2 Dkv)
        if layer.attn_qkv_bias is not None:
            qkv += layer.attn_qkv_bias
        q, k = qkv[:, :Dq], qkv[:, Dq : Dq + Dkv]
        if spec.qk_norm_full:  # olmo2: one norm over all heads' queries (and keys)
            q = be.rms_norm(q, layer.attn_q_norm, hp.eps)
            k = be.rms_norm(k, layer.attn_k_norm, hp.eps)
        q, k = q.reshape(n, H, Dh), k.reshape(n, Hkv, Dh)
        v = qkv[:, Dq + Dkv :].reshape(n, Hkv, Dh)
        if layer.attn_q_norm is not None and not spec.qk_norm_full:
            q = be.rms_norm(q, layer.attn_q_norm, hp.eps)
            k = be.rms_norm(k, layer.attn_k_norm, hp.eps)
        if layer.rope is not None:
            q, k = self._rope(q, step, layer.rope), self._rope(k, step, layer.rope)
        window, sinks = layer.window, layer.attn_sinks
        attn = step.attention(q, k, v, li, self.attn_scale, window, spec.attn_softcap, sinks)
        out = step.linear(attn, layer.attn_output)  # (n, D)
        if layer.attn_output_bias is not None:
            out = out + layer.attn_output_bias
        if layer.post_attention_norm is not None:
            out = be.rms_norm(out, layer.post_attention_norm, hp.eps)
        if self.residual_scale is not None:
            out = out * self.residual_scale
        x = x + out

        h = x if layer.ffn_norm is None else be.rms_norm(x, layer.ffn_norm, hp.eps)
        if layer.moe is not None:
            out = layer.moe.forward(be, h, step, spec.activation)
        else:
            gate_up = step.linear(h, layer.ffn_gate_up)  # (n, 2F)
            out = step.linear(be.glu(gate_up, hp.d_ff, spec.activation), layer.ffn_down)
        if layer.post_ffw_norm is not None:
            out = be.rms_norm(out, layer.post_ffw_norm, hp.eps)
        if self.residual_scale is not None:
            out = out * self.residual_scale
        return x + out

    def _rope(self, x, step, table: RopeTable):
        """RoPE over each head's first rope_dim values (all of them but for partial RoPE,
        phi3's Phi-4-mini: the rest pass through)."""
        if self.long_rope is not None and step.kv.n_ctx > self.spec.rope_orig_ctx:
            table = self.long_rope
        rot = self.hp.rope_dim
        if rot == x.shape[-1]:
            return self.backend.rope(x, step.positions, table, self.spec.neox_rope)
        x = x.copy()
        x[..., :rot] = self.backend.rope(x[..., :rot], step.positions, table, self.spec.neox_rope)
        return x

    def _logits(self, x, step, keep_on_device: bool = False, argmax=None) -> np.ndarray:
        be = self.backend
        if not self.heads:  # a stage before the last: its hidden states go on
            return x
        h = be.rms_norm(x, self.output_norm, self.hp.eps)
        logits = self._argmax_logits(h, argmax)
        if logits is None:
            logits = step.linear(h, self.output)  # (n, V)
        if self.spec.logit_divisor > 0:
            logits = logits / be.dtype.type(self.spec.logit_divisor)
        if self.spec.final_softcap > 0:
            logits = be.softcap(logits, self.spec.final_softcap)
        return logits if keep_on_device else be.to_host(logits)

    def _argmax_logits(self, h, argmax):
        """The backend's argmax path for the rows `argmax` marks (Backend.argmax_logits);
        None where it has none. Not under a logit divisor or soft-cap: rounding there can
        tie two ids the raw logits order, and a tie goes to the lower id."""
        if not argmax or self.spec.logit_divisor > 0 or self.spec.final_softcap > 0:
            return None
        return self.backend.argmax_logits(h, self.output, argmax)


def load_decoder(
    gf: GGUFFile,
    spec: ArchSpec,
    progress=None,
    cache=None,
    backend: Backend | None = None,
    quantize: bool = False,
    layers: range | None = None,
) -> DecoderModel:
    """Build a DecoderModel of `spec` from `gf` on `backend` (default: the compiled CPU
    kernels when built, else numpy); `quantize`: float matrices to Q8_0 at load; `layers`:
    only those (one stage of a split model)."""
    if backend is None:
        from kernels import get_backend

        backend = get_backend()
    source = TensorSource(gf, backend, progress, cache, quantize)
    return DecoderModel(gf, spec, source, layers)
