"""The mixture-of-experts FFN: a router picks k of E experts per row, their SwiGLU outputs
are summed with the router's weights.

An expert is one slice of the GGUF's stacked expert tensors (`ffn_gate_exps`,
`ffn_up_exps`, `ffn_down_exps`: [E, F, D] / [E, D, F]), handed to the backend as its own
matrix over those rows of the file's blocks (`TensorSource.experts`: a view, never a
copy), so a product reads only the chosen experts' blocks. The rows of a step are grouped
by expert: each chosen expert is one product over every row routed to it (decode: the B
rows of the step share its weight read; prefill: the chunk's tokens).

Routing, grouping and the weighted sum are the backend's (`Backend.mixture`,
kernels/moe.py); the expert products are the step's `linear` here. The compiled CPU
backend routes in C (`CpuBackend.route`) and runs a decode step's whole mixture in its
one-call decode stack (kernels/cpu/mixture.c), bitwise this path. Batch invariance:
routing is row-wise (softmax or sigmoid over the row's own logits, a stable top-k), each
expert product goes through the step's `linear` (row-invariant for decode), and the k
outputs are summed in rank order (highest router weight first), so a row's result is the
same bits alone or in any batch. A packed prefill (several chunks in
one pass) groups each chunk's tokens on their own, so each chunk gets the row counts —
and the kernels — its own pass would give it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels.weights import Weight

from ..types import ModelLoadError

# GGUF `{arch}.expert_gating_func` (llama.cpp's enum; 3 is its SOFTMAX_WEIGHT)
GATING = {1: "softmax", 2: "sigmoid", 3: "softmax_topk"}


@dataclass(frozen=True)
class MoeSpec:
    """What an architecture declares about its experts; defaults for keys a file omits."""

    gating: str = "softmax"  # "softmax" or "sigmoid" of the router logits; "softmax_topk":
    # a softmax over the k chosen logits only (gpt-oss)
    norm_topk: bool = True  # the k chosen weights rescaled to sum to 1 (qwen3moe: always)


@dataclass(frozen=True)
class MoeParams:
    n_expert: int
    n_used: int  # k
    d_ff: int  # each expert's hidden width
    gating: str
    norm_topk: bool
    scale: float = 1.0  # `expert_weights_scale`: the chosen weights times this

    @classmethod
    def from_gguf(cls, gf, spec: MoeSpec) -> MoeParams:
        n_expert = int(gf.arch_value("expert_count", 0))
        n_used = int(gf.arch_value("expert_used_count", 0))
        if not 0 < n_used <= n_expert:
            raise ModelLoadError(
                f"{gf.architecture}: expert_used_count {n_used} of expert_count {n_expert}"
            )
        gating = spec.gating
        if gf.arch_value("expert_gating_func") is not None:
            kind = int(gf.arch_value("expert_gating_func"))
            if kind not in GATING:
                raise ModelLoadError(f"{gf.architecture}: unknown expert_gating_func {kind}")
            gating = GATING[kind]
        d_ff = gf.arch_value("expert_feed_forward_length")
        if d_ff is None and gf.has_tensor("blk.0.ffn_gate_exps.weight"):
            d_ff = gf.tensors["blk.0.ffn_gate_exps.weight"].shape[1]  # [D, F, E]
        if d_ff is None:
            raise ModelLoadError(f"{gf.architecture}: no expert_feed_forward_length")
        return cls(
            n_expert=n_expert,
            n_used=n_used,
            d_ff=int(d_ff),
            gating=gating,
            norm_topk=bool(gf.arch_value("expert_weights_norm", spec.norm_topk)),
            scale=float(gf.arch_value("expert_weights_scale", 1.0) or 1.0),
        )


@dataclass(eq=False)
class MoeWeights:
    """One layer's router and experts (and a shared expert, where the file has one)."""

    params: MoeParams
    router: Weight  # (E, D): ffn_gate_inp
    gate_up: list[Weight]  # per expert (2F, D): its gate rows, then its up rows
    down: list[Weight]  # per expert (D, F)
    shared_gate_up: Weight | None = None  # ffn_{gate,up}_shexp, added unweighted
    shared_down: Weight | None = None
    # Biases (gpt-oss): the router's (E,), and per expert its gate/up (2F,) and down (D,).
    router_bias: Any = None
    gate_up_bias: list | None = None
    down_bias: list | None = None
    # The whole FFN of a prefill's rows in one compiled call (the CPU backend's, from its
    # fused decode plan: kernels/cpu/backend.py), or None: the products one by one.
    prefill_ffn: Any = None

    @property
    def nbytes(self) -> int:
        # An expert is a view of its layer's stacked tensor: the views' bytes are the stack's.
        matrices = [self.router, *self.gate_up, *self.down, self.shared_gate_up, self.shared_down]
        biases = [self.router_bias, *(self.gate_up_bias or ()), *(self.down_bias or ())]
        return int(sum(w.nbytes for w in [*matrices, *biases] if w is not None))

    def forward(self, be, h, step, activation: str) -> Any:
        """The FFN of n normed rows h (n, D) on `step` (the block's Prefill, PackedPrefill
        or Decode): (n, D)."""
        p = self.params
        if self.prefill_ffn is not None and getattr(step, "prefill", False):
            return self.prefill_ffn(h)

        def expert(e: int, rows):
            gate_up = step.linear(rows, self.gate_up[e])
            if self.gate_up_bias is not None:
                gate_up = gate_up + self.gate_up_bias[e]
            out = step.linear(be.glu(gate_up, p.d_ff, activation), self.down[e])
            return out if self.down_bias is None else out + self.down_bias[e]

        logits = step.linear(h, self.router)
        if self.router_bias is not None:
            logits = logits + self.router_bias
        segments = _segments(step, h.shape[0])
        out = be.mixture(h, logits, expert, segments, p.n_used, p.gating, p.norm_topk, p.scale)
        if self.shared_gate_up is not None:
            width = self.shared_down.shape[1]
            hidden = be.glu(step.linear(h, self.shared_gate_up), width, activation)
            out = out + step.linear(hidden, self.shared_down)
        return out


def _segments(step, n: int) -> list[slice]:
    """Row ranges grouped apart: a packed prefill's chunks (`chunks`: (slot, start, count)
    in row order), else all n rows as one."""
    chunks = getattr(step, "chunks", None)
    if not chunks:
        return [slice(0, n)]
    out, row = [], 0
    for _, _, count in chunks:
        out.append(slice(row, row + count))
        row += count
    return out


def load_moe(source, prefix: str, params: MoeParams) -> MoeWeights:
    """One layer's router and experts from `source` (engine.loading.tensors.TensorSource)."""
    E = params.n_expert
    gates = source.experts(prefix + "ffn_gate_exps.weight", E)
    ups = source.experts(prefix + "ffn_up_exps.weight", E)
    downs = source.experts(prefix + "ffn_down_exps.weight", E)
    layer = MoeWeights(
        params=params,
        router=source.matrix(prefix + "ffn_gate_inp.weight"),
        gate_up=[source.backend.stacked_weight([g, u]) for g, u in zip(gates, ups, strict=True)],
        down=downs,
    )
    if layer.router.shape[0] != E:
        raise ModelLoadError(f"{prefix}ffn_gate_inp has {layer.router.shape[0]} rows, not {E}")
    layer.router_bias = source.vector(prefix + "ffn_gate_inp.bias", optional=True)
    names = [prefix + f"ffn_{x}_exps.bias" for x in ("gate", "up", "down")]
    layer.gate_up_bias = source.expert_biases(names[:2], E)
    layer.down_bias = source.expert_biases(names[2:], E)
    if gates[0].shape[0] != params.d_ff or downs[0].shape[1] != params.d_ff:
        raise ModelLoadError(f"{prefix}experts are not {params.d_ff} wide")
    if source.has(prefix + "ffn_gate_shexp.weight"):
        layer.shared_gate_up = source.matrix(
            [prefix + "ffn_gate_shexp.weight", prefix + "ffn_up_shexp.weight"]
        )
        layer.shared_down = source.matrix(prefix + "ffn_down_shexp.weight")
    return layer
