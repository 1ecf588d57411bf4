"""The arithmetic of a mixture-of-experts FFN around its expert products: routing (a
softmax or sigmoid over each row's router logits, a stable top-k, optional
renormalisation; or gpt-oss's top-k of the raw logits, then a softmax over those k),
grouping rows by expert, and the weighted sum of each row's k outputs.

Every step is row-wise, so a row's result is the same bits alone or in any batch:
routing runs on the host in float64 per row (ties go to the lower expert id), and the k
outputs are summed in rank order (the highest router weight first). `Backend.mixture`
runs this on any backend's arrays (numpy, or CuPy: the module comes from the input).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

GATINGS = ("softmax", "sigmoid", "softmax_topk")


def route(
    logits: np.ndarray, n_used: int, gating: str, norm_topk: bool, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's n_used experts, best first, and their weights: (n, k) int64 and float32."""
    if gating not in GATINGS:
        raise ValueError(f"expert gating {gating!r}: use one of {GATINGS}")
    z = np.asarray(logits, dtype=np.float64)
    if gating == "softmax_topk":  # llama.cpp's SOFTMAX_WEIGHT: the k best logits, softmaxed
        chosen = np.argsort(-z, axis=-1, kind="stable")[:, :n_used]
        top = np.take_along_axis(z, chosen, axis=-1)
        weights = np.exp(top - top[:, :1])  # the first is the largest
        weights /= weights.sum(axis=-1, keepdims=True)
        return chosen.astype(np.int64), (weights * scale).astype(np.float32)
    if gating == "softmax":
        probs = np.exp(z - z.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
    else:
        probs = 1.0 / (1.0 + np.exp(-z))
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, chosen, axis=-1)
    if norm_topk:
        weights /= weights.sum(axis=-1, keepdims=True)
    if scale != 1.0:
        weights *= scale
    return chosen.astype(np.int64), weights.astype(np.float32)


def groups(chosen: np.ndarray, rows: slice) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(expert, row indices, ranks) for every expert chosen by rows `rows`, by expert id:
    the rows (ascending) that expert serves and at which rank each chose it."""
    block = chosen[rows]
    k = block.shape[1]
    flat = block.ravel()
    order = np.argsort(flat, kind="stable")  # by expert, row-major within one
    ids = flat[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    return [
        (int(ids[a]), order[a:b] // k + rows.start, order[a:b] % k)
        for a, b in zip(starts, ends, strict=True)
    ]


def array_module(x):
    """numpy, or CuPy for a CuPy array."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def mixture(
    x: Any,
    logits: np.ndarray,
    expert: Callable[[int, Any], Any],
    segments: Sequence[slice],
    n_used: int,
    gating: str,
    norm_topk: bool,
    scale: float = 1.0,
    router: Callable = route,
) -> Any:
    """sum_j w_j expert(e_j, x) over each row's chosen experts. `logits` (n, E) on the host;
    `expert(e, rows)` is expert e's output (m, D) for rows (m, D) of x. Rows of different
    `segments` are never grouped together (a packed prefill's chunks: each then sees the
    row counts its own pass would). `router`: `route` or a backend's own of the same rule
    (the compiled CPU backend's, so that its per-op path routes as its fused step does)."""
    xp = array_module(x)
    n = x.shape[0]
    chosen, weights = router(logits, n_used, gating, norm_topk, scale)

    def index(a: np.ndarray):
        return a if xp is np else xp.asarray(a)

    ranked = None  # (n, k, D): every row's output of its j-th expert at [row, j]
    for rows in segments:
        for e, at, ranks in groups(chosen, rows):
            y = expert(e, x[index(at)])
            if ranked is None:
                ranked = xp.empty((n, n_used, y.shape[1]), dtype=y.dtype)
            ranked[index(at), index(ranks)] = y
    w = index(weights)
    out = ranked[:, 0] * w[:, 0:1]
    for j in range(1, n_used):  # rank order: a row's sum is the same alone or batched
        out = out + ranked[:, j] * w[:, j : j + 1]
    return out
