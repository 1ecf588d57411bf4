"""The compiled CPU backend: weights stay in their GGUF blocks, compiled kernels compute
on them (kernels/cpu/, built into the `kernels._cpu` extension).

Decode (`linear`): one call into C per matrix; the kernel decodes each weight block once
and multiplies it against every row of the batch, with float32 activations, so a row's
arithmetic is the same whatever else is in the batch (and however many threads run).
Prefill (`linear_prefill`): tiles of weight rows dequantised into an L2-sized buffer and
multiplied by a blocked micro-kernel, on the same thread pool; attention (prefill and
decode), RMSNorm and RoPE are compiled too; so is a mixture of experts' routing (the
per-op path's and the fused decode step's alike) and, in the fused step, its whole FFN.
Nothing on this path calls BLAS, so no second pool of spinning threads competes for the
cores.

PANTHEON_ACTIVATIONS=bfloat16 (opt-in, AVX-512 BF16 CPUs) makes `linear` round x and the
decoded weights to bfloat16 and sum their products in float32 (vdpbf16ps): about 1.5x the
float32 product at B = 8, greedy text closer to the float32 reference's than llama.cpp's
8-bit activations, logits within ~0.2 of it (tests/kernels/cpu/test_bf16_activations.py).
Prefill chunks of more than four tokens stay float32.

Types without a kernel fall back to the numpy reference's path (float32 at load); the
model reports which (`DecoderModel.fallback_types`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Sequence

import numpy as np
from gguf import GGMLQuantizationType

from kernels import moe
from kernels.backend import BLOCKS, DENSE
from kernels.cpu import load_extension
from kernels.devices import threads
from kernels.host_buffers import host_empty
from kernels.reference.backend import NumpyBackend
from kernels.weights import Weight, parts_of, stack_parts

log = logging.getLogger("pantheon.engine")

# The compiled activations of the gated FFN (kernels/cpu/decode.h).
GLU_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
# The compiled routings of a mixture of experts (kernels/cpu/mixture.h).
MOE_GATINGS = {"softmax": 0, "sigmoid": 1, "softmax_topk": 2}

# Prompt chunks at most this long go through the decode kernel (no dequantised tile).
PREFILL_DIRECT_ROWS = 4
# Greedy rows from which argmax_logits' int8 screen (kernels/cpu/greedy.c) costs less than
# the full output product: SmolLM2's 49,152 x 576 Q8_0 matrix, 2 threads, 1.1-1.3 ms for
# any B up to 8 against 0.9 ms at B = 2, 1.45 at 4 and 2.9 at 8 (bench/RESULTS.md).
GREEDY_MIN_ROWS = 4


# The decode products' activations (kernels/cpu/quants.h): float32 unless the server's
# PANTHEON_ACTIVATIONS setting asked for bfloat16 (configure_activations, at start) and
# the CPU has AVX-512 BF16.
ACTIVATIONS_ENV = "PANTHEON_ACTIVATIONS"
ACTIVATIONS = ("float32", "bfloat16")
_requested = {"activations": "float32"}


def requested_activations() -> str:
    return _requested["activations"]


def _known(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"{ACTIVATIONS_ENV}={name!r}: use float32 or bfloat16")
    return name


def configure_activations(name: str) -> str:
    """The activations the compiled backend uses from now on (pantheon_site/asgi.py calls
    this with the setting before any model loads; a backend already built switches at
    once). Returns what is in use ("float32" where bfloat16 cannot run, or without the
    compiled kernels)."""
    _requested["activations"] = _known(name)
    ext = load_extension()
    return set_activations(ext, name) if ext is not None else "float32"


def set_activations(ext, name: str) -> str:
    """Ask the kernels for `name`'s products; returns what they use. bfloat16 on a CPU
    without AVX-512 BF16 stays float32, with a warning in the log (GET / and
    /admin/models say what is in use): slower, never wrong."""
    name = _known(name)
    try:
        ext.set_activations(name)
    except ValueError as exc:
        log.warning("%s=%s not used: %s", ACTIVATIONS_ENV, name, exc)
    return ext.activations()


class CpuBackend(NumpyBackend):
    """numpy arrays on the host, matrices in GGUF block layout, compiled kernels."""

    name = "cpu"
    packs_prefill = True  # prefill.c: an output's arithmetic depends on x[t], W[r], K only
    prefill_direct_rows = PREFILL_DIRECT_ROWS

    def __init__(self, ext=None):
        self.ext = ext if ext is not None else load_extension()
        if self.ext is None:
            raise ValueError(
                "the compiled CPU kernels (kernels._cpu) are not built here: run "
                "`make setup` (needs a C compiler), or use the numpy backend"
            )
        self.qtypes: dict[str, int] = dict(self.ext.QTYPES)
        self.isa = self.ext.isa()
        self.ext.set_threads(threads.kernel_threads())
        set_activations(self.ext, requested_activations())

    @property
    def activations(self) -> str:
        """What the decode products round x and W to: "float32" (the default: exact, the
        float32 reference's tolerances) or "bfloat16" (opt-in, PANTHEON_ACTIVATIONS)."""
        return self.ext.activations()

    # ---- weights ----

    def storage_for(self, qtype: GGMLQuantizationType) -> str:
        return BLOCKS if qtype.name in self.qtypes else DENSE

    def dense_weight(self, array: np.ndarray) -> Weight:
        array = np.ascontiguousarray(array, dtype=np.float32)
        return Weight("f32", tuple(array.shape), array, {"kid": self.qtypes["F32"]})

    def block_weight(self, blocks, qtype, shape) -> Weight:
        n, k = int(shape[0]), int(shape[1])
        if qtype == GGMLQuantizationType.F32:  # already values: the file's map, viewed
            return self.dense_weight(np.ascontiguousarray(blocks).view(np.float32))
        blocks = np.ascontiguousarray(blocks)
        kid = self.qtypes[qtype.name]
        return Weight(qtype.name, (n, k), blocks, {"qtype": qtype, "kid": kid})

    def stacked_weight(self, parts: list[Weight]) -> Weight:
        """Stacked matrices (q/k/v, gate/up; of one block type or of several, as Q5_0,
        Q5_0, Q8_0) as parts, each kept as it was made, never copied."""
        return stack_parts(parts)

    _parts = staticmethod(parts_of)

    # ---- matmuls ----

    def embed(self, table: Weight, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64)
        if table.storage == "f32":
            return table.data[ids]
        out = np.empty((len(ids), table.shape[1]), dtype=np.float32)
        self.ext.dequantize(table.meta["kid"], np.ascontiguousarray(table.data[ids]), out)
        return out

    def linear(self, x: np.ndarray, w: Weight) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        # A decode step's logits (1.5 MB at B = 8) on reused pages (host_buffers.py).
        out = host_empty((x.shape[0], w.shape[0]), np.float32)
        for col0, part in self._parts(w):
            self.ext.linear(part.meta["kid"], part.data, x, out, col0)
        return out

    def argmax_logits(self, x, w: Weight, argmax):
        """Q8_0 output matrices on CPUs with AVX-512 VNNI, from GREEDY_MIN_ROWS greedy
        rows: screened with int8 dot products and a rigorous bound, the few ids that could
        win computed by linear's own row kernel (kernels/cpu/greedy.c); the other rows by
        linear (each row's bits are its own either way)."""
        rows = [i for i, bans in enumerate(argmax) if bans is not None]
        if len(rows) < GREEDY_MIN_ROWS or not self._greedy_ready(w):
            return None
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = host_empty((x.shape[0], w.shape[0]), np.float32)
        if len(rows) == len(argmax):
            self._screen(x, w, argmax, out)
            return out
        picked = np.empty((len(rows), w.shape[0]), dtype=np.float32)
        self._screen(x[rows], w, [argmax[i] for i in rows], picked)
        out[rows] = picked
        rest = [i for i, bans in enumerate(argmax) if bans is None]
        out[rest] = self.linear(x[rest], w)
        return out

    def _screen(self, x, w: Weight, bans, out) -> None:
        off = np.zeros(len(bans) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in bans], out=off[1:])
        ids = np.fromiter((i for b in bans for i in b), dtype=np.int64, count=int(off[-1]))
        computed = np.empty(len(bans), dtype=np.int64)  # ids computed in float32, per row
        norms, sums = w.meta["greedy"]
        self.ext.greedy_logits(w.data, norms, sums, x, off, ids, out, computed)

    def _greedy_ready(self, w: Weight) -> bool:
        """Whether argmax_logits can screen w; its row norms and block sums made once."""
        prep = w.meta.get("greedy")
        if prep is None:
            prep = False
            q8 = w.meta.get("qtype") == GGMLQuantizationType.Q8_0 and w.data is not None
            if q8 and w.shape[1] % 32 == 0 and self.ext.greedy_fast():
                norms = np.empty(w.shape[0], dtype=np.float32)
                sums = np.empty((w.shape[0], w.shape[1] // 32), dtype=np.int16)
                self.ext.greedy_prep(w.data, norms, sums)
                if np.isfinite(norms).all():  # a bound needs finite weights
                    prep = (norms, sums)
            w.meta["greedy"] = prep
        return prep is not False

    def linear_prefill(self, x: np.ndarray, w: Weight) -> np.ndarray:
        if x.shape[0] <= PREFILL_DIRECT_ROWS:
            return self.linear(x, w)
        # Tiles of weight rows dequantised into an L2-sized buffer per thread and
        # multiplied by every token in C, on the kernels' own pool (no BLAS).
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        for col0, part in self._parts(w):
            self.ext.linear_prefill(part.meta["kid"], part.data, x, out, col0)
        return out

    # ---- small ops and attention, compiled ----

    def rms_norm(self, x, weight, eps):
        shape = x.shape
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, shape[-1])
        out = np.empty_like(x2)
        self.ext.rms_norm(x2, weight, float(eps), out)
        return out.reshape(shape)

    def glu(self, gate_up, d_ff: int, activation: str):
        # Compiled (not numpy's exp/tanh), so the fused decode step's bits are these.
        if activation not in GLU_ACTIVATIONS:  # gpt-oss's clamped SwiGLU: numpy's, row-wise
            return super().glu(gate_up, d_ff, activation)
        gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
        out = np.empty((gate_up.shape[0], d_ff), dtype=np.float32)
        if gate_up.shape[1] != 2 * d_ff:
            raise ValueError(f"glu: gate_up has {gate_up.shape[1]} columns, not 2 x {d_ff}")
        self.ext.glu(gate_up, GLU_ACTIVATIONS[activation], out)
        return out

    def rope(self, x, positions, table, neox: bool):
        out = np.array(x, dtype=np.float32, order="C")  # rotated in place: a fresh copy
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        self.ext.rope(out, pos, table.cos, table.sin, bool(neox))
        return out

    def _attend(self, kernel, q, k, v, kv, layer, where, scale, window, softcap, sinks):
        """Run a compiled attention kernel (it writes k, v into the cache first)."""
        n, H, Dh = q.shape
        out = np.empty((n, H * Dh), dtype=np.float32)
        q, k, v = (np.ascontiguousarray(a, dtype=np.float32) for a in (q, k, v))
        args = (q, k, v, kv.k, kv.v, int(layer), *where, float(scale), int(window))
        if sinks is None:
            kernel(*args, float(softcap), out)
        else:
            kernel(*args, float(softcap), out, np.ascontiguousarray(sinks, dtype=np.float32))
        return out

    def attention_prefill(
        self, q, k, v, kv, layer, slot, start, scale, window=0, softcap=0.0, sinks=None
    ):
        where = (int(slot), int(start))
        out = self._attend(
            self.ext.attention_prefill, q, k, v, kv, layer, where, scale, window, softcap, sinks
        )
        kv.note_written([int(slot)], [int(start) + q.shape[0]])
        return out

    def attention_decode(
        self,
        q,
        k,
        v,
        kv,
        layer,
        slots: Sequence[int],
        positions,
        scale,
        window=0,
        softcap=0.0,
        sinks=None,
    ):
        where = (
            np.ascontiguousarray(slots, dtype=np.int64),
            np.ascontiguousarray(positions, dtype=np.int64),
        )
        out = self._attend(
            self.ext.attention_decode, q, k, v, kv, layer, where, scale, window, softcap, sinks
        )
        kv.note_written(where[0], where[1] + 1)
        return out

    # ---- mixture of experts: routed in C ----

    def route(self, logits, n_used: int, gating: str, norm_topk: bool, scale: float = 1.0):
        """kernels/moe.py's `route` (the same rule) computed by the kernels' own C
        (mixture.c), which the fused decode step routes with too: the two paths then
        agree to the bit even where C's exp and numpy's differ in a last place."""
        if gating not in MOE_GATINGS:
            raise ValueError(f"expert gating {gating!r}: use one of {tuple(MOE_GATINGS)}")
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        chosen = np.empty((logits.shape[0], n_used), dtype=np.int64)
        weights = np.empty((logits.shape[0], n_used), dtype=np.float32)
        self.ext.moe_route(
            logits, int(n_used), MOE_GATINGS[gating], bool(norm_topk), float(scale), chosen, weights
        )
        return chosen, weights

    def mixture(
        self,
        x,
        router_logits,
        expert,
        segments,
        n_used,
        gating="softmax",
        norm_topk=True,
        scale=1.0,
    ):
        logits = self.to_host(router_logits)
        args = (n_used, gating, norm_topk, scale)
        return moe.mixture(x, logits, expert, segments, *args, router=self.route)

    # ---- the fused decode step ----

    def decode_stack(self, layers, hp, spec):
        """Every layer of a decode step in one C call (kernels/cpu/decode.c; a mixture of
        experts' FFN: kernels/cpu/mixture.c), bitwise the per-op path above; None where a
        layer has what that call does not do (partial RoPE, an activation it lacks, expert
        biases)."""
        if os.environ.get("PANTHEON_CPU_FUSED_DECODE", "1") == "0":
            return None  # the per-op path, for A/B measurements
        if spec.activation not in GLU_ACTIVATIONS or not layers:
            return None
        for layer in layers:
            mix = getattr(layer, "moe", None)
            if mix is not None and (mix.gate_up_bias is not None or mix.down_bias is not None):
                return None  # gpt-oss's expert biases (its sinks and activation, too)
            if layer.rope.cos.shape[1] * 2 != hp.head_dim:
                return None
            if (layer.attn_q_norm is None) != (layer.attn_k_norm is None):
                return None
        keep: list = []

        def vector(v):
            if v is None:
                return None
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            return v

        def matrix(w: Weight | None):
            if w is None:
                return None
            keep.append(w)
            return [(part.meta["kid"], part.data, col0) for col0, part in self._parts(w)]

        def experts_of(mix):
            if mix is None:
                return None
            p = mix.params
            shared = mix.shared_down.shape[1] if mix.shared_down is not None else 0
            return (
                p.n_expert,
                p.n_used,
                p.d_ff,
                MOE_GATINGS[p.gating],
                bool(p.norm_topk),
                float(p.scale),
                matrix(mix.router),
                vector(mix.router_bias),
                [matrix(w) for w in mix.gate_up],
                [matrix(w) for w in mix.down],
                shared,
                matrix(mix.shared_gate_up),
                matrix(mix.shared_down),
            )

        rows = [
            (
                vector(layer.attn_norm),
                vector(layer.ffn_norm),
                vector(layer.attn_qkv_bias),
                vector(layer.attn_q_norm),
                vector(layer.attn_k_norm),
                vector(layer.post_attention_norm),
                vector(layer.post_ffw_norm),
                vector(layer.rope.cos),
                vector(layer.rope.sin),
                int(layer.window),
                matrix(layer.attn_qkv),
                matrix(layer.attn_output),
                matrix(layer.ffn_gate_up),
                matrix(layer.ffn_down),
                experts_of(getattr(layer, "moe", None)),
            )
            for layer in layers
        ]
        dims = (
            hp.d_model,
            hp.n_head,
            hp.n_kv_head,
            hp.head_dim,
            max(hp.d_ff, 1),  # a mixture's model may declare no dense width
            float(hp.eps),
            1.0 / math.sqrt(hp.head_dim),
            float(spec.attn_softcap),
            bool(spec.neox_rope),
            GLU_ACTIVATIONS[spec.activation],
        )
        try:
            plan = self.ext.decode_plan(dims, rows, keep)
        except ValueError:
            # Shapes the fused step cannot take (a malformed file): the per-op path runs
            # it and says what is wrong when it does.
            return None
        ext = self.ext
        if self.activations == "float32":  # bfloat16 products stay decode's (as linear_prefill)
            for li, layer in enumerate(layers):
                if getattr(layer, "moe", None) is not None:
                    layer.moe.prefill_ffn = functools.partial(_moe_ffn, ext, plan, li)

        def run(x, slots, positions, kv) -> np.ndarray:
            x = np.array(x, dtype=np.float32, order="C")  # a copy, updated in place
            slots = np.ascontiguousarray(slots, dtype=np.int64)
            positions = np.ascontiguousarray(positions, dtype=np.int64)
            ext.decode_layers(plan, x, slots, positions, kv.k, kv.v)
            kv.note_written(slots, positions + 1)
            return x

        return run


def _moe_ffn(ext, plan, layer: int, h) -> np.ndarray:
    """A mixture layer's FFN for a prefill's rows in one compiled call (the fused decode
    step's, so each row's bits are what that step gives it, alone or packed with others)."""
    h = np.ascontiguousarray(h, dtype=np.float32)
    out = np.empty_like(h)
    ext.moe_ffn(plan, layer, h, out)
    return out
