"""Turn logits into a token id: greedy, or temperature + top-k + top-p with a seedable RNG."""

from __future__ import annotations

import numpy as np

from .types import SamplingParams


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits (all when k <= 0 or k >= V), unordered."""
    if k <= 0 or k >= logits.shape[-1]:
        return np.arange(logits.shape[-1])
    return np.argpartition(logits, -k)[-k:]


def apply_top_p(probs_desc: np.ndarray, p: float) -> int:
    """How many of the descending-sorted probabilities form the nucleus of mass p (>= 1)."""
    if p >= 1.0:
        return len(probs_desc)
    cumulative = np.cumsum(probs_desc)
    return int(np.searchsorted(cumulative, p, side="left")) + 1


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        # Any integer seeds (numpy refuses negative ones); non-negative ones are kept as is.
        seed = None if params.seed is None else params.seed % (1 << 128)
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.params
        if p.temperature <= 0:
            return int(np.argmax(logits))
        candidates = apply_top_k(logits, p.top_k)
        scaled = logits[candidates].astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        candidates, scaled = candidates[order], scaled[order]
        probs = np.exp(scaled - scaled[0])
        probs /= probs.sum()
        n = min(apply_top_p(probs, p.top_p), len(probs))
        probs = probs[:n] / probs[:n].sum()
        return int(candidates[self.rng.choice(n, p=probs)])
