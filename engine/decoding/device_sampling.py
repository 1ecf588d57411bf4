"""sampler.sample_batch where the logits lie: array code over `xp` (CuPy on a GPU, numpy
in the suite), for the GPU backend (issue 16).

Per step only small things go to the device: the sparse logit_bias and penalty updates
(rows, ids, values), per-row parameters, the grammar masks packed as bits (unpacked there)
and one uniform per drawing row, drawn on the host from the row's own RNG exactly as
Sampler._draw draws it, so every RNG stream stays the one the host path would leave. One
array comes back: each row's token and logprob, and the top_logprobs of the rows that ask.

The semantics are sampler.py's (its docstring), vectorised over the rows:
  - steps 1-5 in float64: the same elementwise operations, so bitwise the same values;
  - greedy is argmax (ties to the lowest id);
  - a draw under top_k / top_p / min_p sorts its row once (stable, most likely first: the
    order apply_top_k and Sampler._draw use), counts the nucleus Sampler._draw would keep,
    and picks with the running sum; a draw without them picks in id order, as _pick does.
_pick sums long vectors in blocks and top_k's mass is summed pairwise here, so the same u
can give another token only when it lies within rounding (~1e-15) of a boundary between
two tokens; on numpy everything else is the host's arithmetic.

No Python loop runs over the vocabulary and nothing reads a device value back mid-step
(no bool(), int() or .item() of a device array): the row loops are host bookkeeping.
"""

from __future__ import annotations

import math

import numpy as np

from .sampler import (
    TOP_P_SLACK,
    Sample,
    Sampler,
    _allowed,
    _gather,
    _penalty_terms,
    forced_sample,
)


def to_host(xp, a) -> np.ndarray:
    return np.asarray(a) if xp is np else xp.asnumpy(a)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """A bool (..., V) mask as uint8 bits, element j in bit j % 8 of byte j // 8: an eighth
    of the bytes to upload."""
    return np.packbits(mask, axis=-1, bitorder="little")


def unpack_mask(xp, bits, V: int):
    """pack_mask undone on the device: bool (..., V)."""
    shifts = xp.arange(8, dtype=np.uint8)
    every = (bits[..., None] >> shifts) & np.uint8(1)
    return every.reshape(*bits.shape[:-1], -1)[..., :V].astype(bool)


def forced_sample_on(xp, sampler: Sampler, row, token_id: int) -> Sample:
    """forced_sample for a row of device logits: the row comes to the host only when the
    sampler reports logprobs (a forced token is rare: the close of a think block)."""
    if not sampler.logprobs:
        return Sample(token_id)
    return forced_sample(sampler, to_host(xp, row), token_id)


def _up(xp, values, dtype):
    """Host values to the device (a few per step, all small)."""
    return xp.asarray(np.asarray(values, dtype=dtype))


def _truncates(s: Sampler, V: int) -> bool:
    return 0 < s.top_k < V or s.top_p < 1.0 or s.min_p > 0.0


def sample_batch_on(xp, samplers: list[Sampler], logits, masks=None) -> list[Sample]:
    """sample_batch for logits (B, V) in xp's memory: row i's Sample is the one
    sample_batch gives (see the module's docstring for the rounding caveat), and each
    sampler's RNG moves as there. Raises ValueError, before any RNG moves, when a mask
    allows nothing. Does not accept() the tokens."""
    B = len(samplers)
    if logits.ndim != 2 or logits.shape[0] != B:
        raise ValueError(f"logits must be ({B}, V), got {logits.shape}")
    V = int(logits.shape[1])
    masks = [None] * B if masks is None else list(masks)
    if len(masks) != B:
        raise ValueError(f"{len(masks)} masks for {B} rows")
    allowed = [_allowed(m, V) for m in masks]  # on the host, before any RNG moves
    if B == 0:
        return []

    # Host bookkeeping. `ranked`: the rows sorted most likely first on the device, those
    # that truncate before drawing, then those that only report top_logprobs. Each drawing
    # row takes its one uniform now, as _draw takes it.
    draw = [i for i, s in enumerate(samplers) if not s.greedy]
    cut = [i for i in draw if _truncates(samplers[i], V)]
    plain = [i for i in draw if i not in cut]
    ranked = cut + [i for i, s in enumerate(samplers) if s.top_logprobs and i not in cut]
    K = min(max(s.top_logprobs for s in samplers), V)  # top_logprobs columns to return
    u = {i: samplers[i].rng.random() for i in draw}

    def up(values, dtype=np.int64):
        return _up(xp, values, dtype)

    with np.errstate(over="ignore", divide="ignore"):  # numpy's warnings; CuPy has none
        x = _transforms(xp, logits.astype(xp.float64), samplers, allowed)
        e = xp.exp(x)
        totals = e.sum(axis=1)
        log_totals = xp.log(totals)
        tokens = xp.argmax(x, axis=1)  # the greedy rows' tokens: ties to the lowest id
        if ranked:
            at_ranked = up(ranked)
            z = x[at_ranked]
            order = _stable_argsort_descending(xp, z)
        if plain:
            at = up(plain)
            n = xp.full(len(plain), V, dtype=np.int64)
            tokens[at] = _pick(xp, e[at], n, up([u[i] for i in plain], np.float64))
        if cut:
            at, o = up(cut), order[: len(cut)]
            ws = xp.take_along_axis(e[at], o, axis=1)
            p = up([_cut_params(samplers[i], V, u[i]) for i in cut], np.float64)
            n = _nucleus(xp, xp.take_along_axis(z[: len(cut)], o, axis=1), ws, totals[at], p)
            j = _pick(xp, ws, n, p[:, 4])
            tokens[at] = xp.take_along_axis(o, j[:, None], axis=1)[:, 0]

        chosen = xp.take_along_axis(x, tokens[:, None], axis=1)[:, 0] - log_totals
        parts = [tokens.astype(xp.float64), chosen]
        if K:
            top_ids = order[:, :K]
            top_logprobs = xp.take_along_axis(z, top_ids, axis=1) - log_totals[at_ranked][:, None]
            parts += [top_ids.astype(xp.float64).ravel(), top_logprobs.ravel()]
    got = to_host(xp, xp.concatenate(parts))  # the step's one copy back

    top_ids = got[2 * B : 2 * B + len(ranked) * K].reshape(len(ranked), K)
    top_logprobs = got[2 * B + len(ranked) * K :].reshape(len(ranked), K)
    out = []
    for i, s in enumerate(samplers):
        token = int(got[i])
        if not s.logprobs:
            out.append(Sample(token))
            continue
        top: tuple[tuple[int, float], ...] = ()
        if s.top_logprobs:
            r, k = ranked.index(i), min(s.top_logprobs, V)
            pairs = zip(top_ids[r, :k], top_logprobs[r, :k], strict=True)
            top = tuple((int(t), float(v)) for t, v in pairs if v > -np.inf)  # as _top
        out.append(Sample(token, float(got[B + i]), top))
    return out


def _transforms(xp, x, samplers: list[Sampler], allowed: list):
    """Steps 1-5 on (B, V) float64 logits, as sampler._apply_transforms: the same
    elementwise operations, with the non-finite rows fixed by where() rather than a loop."""
    B, V = x.shape

    def up(values, dtype):
        return _up(xp, values, dtype)

    got = _gather(samplers, V, lambda s: (s.bias_ids, s.bias_values))
    if got is not None:
        rows, ids, bias = got
        ban = bias == -np.inf  # set, not added, as on the host (split here, on the host)
        x[up(rows[~ban], np.int64), up(ids[~ban], np.int64)] += up(bias[~ban], np.float64)
        x[up(rows[ban], np.int64), up(ids[ban], np.int64)] = -xp.inf
    got = _gather(samplers, V, _penalty_terms)
    if got is not None:
        rows, ids, *terms = got
        rows, ids = up(rows, np.int64), up(ids, np.int64)
        counts, rep, presence, frequency = up(terms, np.float64)
        v = x[rows, ids]
        v = xp.where(v > 0.0, v / rep, v * rep)
        v -= presence + frequency * counts
        x[rows, ids] = v

    masked = [i for i in range(B) if allowed[i] is not None]
    keep = None  # (B, V) bool: the tokens each row's grammar allows
    if masked:
        bits = pack_mask(np.stack([allowed[i] for i in masked]))
        keep = xp.ones((B, V), dtype=bool)
        keep[up(masked, np.int64)] = unpack_mask(xp, xp.asarray(bits), V)
        x = xp.where(keep, x, -xp.inf)

    # A row without a usable logit: its +inf ones share the mass; with none (all -inf, or a
    # NaN, which max propagates), the allowed tokens do.
    top = x.max(axis=1, keepdims=True)
    x = xp.where(top == xp.inf, xp.where(x == xp.inf, 0.0, -xp.inf), x)
    none = ~xp.isfinite(top) & (top != xp.inf)
    x = xp.where(none, 0.0 if keep is None else xp.where(keep, 0.0, -xp.inf), x)
    x -= xp.where(xp.isfinite(top), top, 0.0)
    # Dividing by 1.0 is exact, so every row divides (the host skips a batch of ones).
    x /= up([s.temperature for s in samplers], np.float64)[:, None]
    return x


def _stable_argsort_descending(xp, z):
    """Each row's ids most likely first, ties to the lower id (apply_top_k's order). + 0.0
    turns -0.0 into 0.0, which a radix sort (CuPy's) would order before 0.0."""
    key = -z + 0.0
    if xp is np:
        return np.argsort(key, axis=1, kind="stable")
    return xp.argsort(key, axis=1)  # CuPy's sort is always stable (and takes no kind)


def _cut_params(s: Sampler, V: int, u: float) -> list[float]:
    """A truncating row's parameters for _nucleus and _pick: k (V: no top_k), top_p,
    min_p, log(min_p) as _draw computes it (math.log, on the host), u."""
    k = s.top_k if 0 < s.top_k < V else V
    log_min_p = math.log(s.min_p) if s.min_p > 0.0 else -math.inf
    return [k, s.top_p, s.min_p, log_min_p, u]


def _nucleus(xp, z, w, totals, p):
    """How many of each row's candidates, sorted most likely first (z: the logits after
    steps 1-5, w = exp(z), totals: w's sums), Sampler._draw draws from. p: _cut_params.

    _draw's candidates: the top k with top_k, else the tokens at or above its floor (a
    prefix of the sorted row); then the top_p nucleus of the mass renormalised over them
    with top_k (over all of V without), the min_p survivors and the non-zero weights."""
    V = z.shape[1]
    k, top_p, min_p, log_min_p = p[:, 0].astype(np.int64), p[:, 1], p[:, 2], p[:, 3]
    pos = xp.arange(V)
    has_k = k < V
    total = xp.where(has_k, xp.where(pos < k[:, None], w, 0.0).sum(axis=1), totals)
    floor = xp.maximum(log_min_p, xp.where(top_p < 1.0, xp.log(total * (1.0 - top_p) / V), -xp.inf))
    cap = xp.where(has_k, k, (z >= (floor - 1e-9)[:, None]).sum(axis=1))
    # Each count below is the length of a prefix of the sorted row (cum and w are monotone),
    # so counting over all of V and taking the minimum with cap counts over the candidates.
    cum = xp.cumsum(w / total[:, None], axis=1)
    # apply_top_p: searchsorted(cum, p - slack, "left") + 1 is the count of cum < p - slack,
    # plus one.
    n_p = xp.where(top_p < 1.0, (cum < (top_p - TOP_P_SLACK)[:, None]).sum(axis=1) + 1, cap)
    n_m = xp.where(min_p > 0.0, (w >= (min_p * w[:, 0])[:, None]).sum(axis=1), cap)
    n_w = (w > 0.0).sum(axis=1)
    return xp.minimum(xp.minimum(n_p, n_m), xp.minimum(n_w, cap))


def _pick(xp, w, n, u):
    """Per row, sampler._pick(w[:n], u): the first of its n leading weights whose running
    sum, normalised by theirs, exceeds u. A zero weight repeats its predecessor's sum and
    the last normalised sum is exactly 1 > u, so neither is ever chosen."""
    c = xp.cumsum(w, axis=1)
    last = xp.take_along_axis(c, (n - 1)[:, None], axis=1)
    within = xp.arange(w.shape[1]) < n[:, None]
    return ((c / last <= u[:, None]) & within).sum(axis=1)
