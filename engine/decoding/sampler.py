"""Turn logits into tokens: the OpenAI sampling surface, one RNG per sequence.

Transforms, in order, on each row of logits (float64):
  1. logit_bias: each (id, bias) added (a -inf one, a ban, sets -inf whatever the logit);
     ids outside the vocabulary are ignored.
  2. repetition_penalty r over the tokens generated so far: a positive logit / r, a
     negative one * r (llama.cpp).
  3. presence / frequency penalties over the generated tokens (OpenAI):
     logit -= presence * [count > 0] + frequency * count.
  4. grammar mask: disallowed tokens get -inf and can never be drawn, greedy or not.
  5. temperature <= 0: greedy argmax (ties to the lowest id). Otherwise logits / temperature.
  6. top_k, then top_p (the smallest most-likely-first prefix whose mass reaches p, of the
     distribution renormalised over the top_k), then min_p (drop tokens whose probability
     is below min_p x the most likely one's); renormalise over what is left and draw.

Logprobs are those of the distribution after steps 1-5 (temperature 1 when greedy),
before step 6: the truncation only decides which tokens may be drawn, so the reported
numbers do not depend on top_k/top_p/min_p and alternatives outside the truncation still
get their real, finite logprob. A masked token's logprob is -inf; such tokens are left out
of `top`. Nothing of this is computed unless params.logprobs or top_logprobs > 0 asks.

Every value in SamplingParams is clamped again here (the HTTP edge already does), so any
value is safe. `sample_batch` runs the elementwise steps over all rows at once and draws
each row with its own RNG: a row's Sample is bit for bit the one `sample` gives alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..types import SamplingParams

MAX_TOP_LOGPROBS = 20
_FMAX = float(np.finfo(np.float64).max)
_IMAX = int(np.iinfo(np.int64).max)
_PICK_BLOCK = 256
_BELOW_ONE = float(np.nextafter(1.0, 0.0))


@dataclass(frozen=True)
class Sample:
    token_id: int
    logprob: float | None = None  # of token_id, when params.logprobs (or top_logprobs > 0)
    top: tuple[tuple[int, float], ...] = ()  # top_logprobs (id, logprob), most likely first


def _clamp(value: float, lo: float, hi: float, default: float) -> float:
    value = float(value)
    return default if math.isnan(value) else min(max(value, lo), hi)


def apply_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest logits (all when k <= 0 or k >= V), largest first, ties to
    the lower id: a stable descending sort, without sorting (or partitioning) all of V."""
    V = len(logits)
    if k <= 0 or k >= V:
        return np.argsort(-logits, kind="stable")
    # The smallest of the maxima of k disjoint blocks is <= the k-th largest value, so the
    # tokens at or above it (a few times k, typically) hold the top k and all their ties.
    floor = logits[: V - V % k].reshape(k, -1).max(axis=1).min()
    if floor > -np.inf:
        pool = np.flatnonzero(logits >= floor)
        return pool[_top_k_of(logits[pool], k)]
    # A block holds only -inf (masked) tokens: the finite ones, then the lowest -inf ids.
    finite = np.flatnonzero(logits > -np.inf)
    if len(finite) >= k:
        return finite[_top_k_of(logits[finite], k)]
    finite = finite[np.lexsort((finite, -logits[finite]))]
    return np.concatenate((finite, np.flatnonzero(logits == -np.inf)[: k - len(finite)]))


def _top_k_of(values: np.ndarray, k: int) -> np.ndarray:
    """apply_top_k by argpartition: positions of the k largest, largest first, ties to the
    lower position."""
    n = len(values)
    if k >= n:
        return np.argsort(-values, kind="stable")
    kth = values[np.argpartition(values, n - k)[n - k]]
    above = np.flatnonzero(values > kth)
    ties = np.flatnonzero(values == kth)[: k - len(above)]
    idx = np.concatenate((above, ties))
    return idx[np.lexsort((idx, -values[idx]))]


# top_p's nucleus is the shortest prefix whose mass reaches p less this slack. A prefix
# that reaches p exactly (a uniform row and p = 0.5: every token -inf, say) would otherwise
# hinge on the last bits of a running sum (1.8e-13 off after 24,576 terms of 1 / 49,152),
# and the order of that sum differs between numpy and a device's parallel scan (seen on an
# H200: device_sampling's nucleus one token shorter).
TOP_P_SLACK = 1e-9


def apply_top_p(probs_desc: np.ndarray, p: float) -> int:
    """How many of the descending-sorted probabilities form the nucleus of mass p (>= 1)."""
    if p >= 1.0:
        return len(probs_desc)
    cumulative = np.cumsum(probs_desc)
    return int(np.searchsorted(cumulative, p - TOP_P_SLACK, side="left")) + 1


def apply_min_p(weights_desc: np.ndarray, min_p: float) -> int:
    """How many of the descending-sorted weights (probabilities, normalised or not) are at
    least min_p x the largest."""
    if min_p <= 0.0:
        return len(weights_desc)
    return int(np.count_nonzero(weights_desc >= min_p * weights_desc[0]))


def ends_banned(params: SamplingParams, end_ids) -> SamplingParams:
    """`params` itself, or with ignore_eos the end-of-turn tokens banned: a bias of -inf
    after the client's (a repeated id's last bias wins), so they are never drawn."""
    if not params.ignore_eos:
        return params
    banned = tuple((int(i), -math.inf) for i in sorted(end_ids))
    return replace(params, logit_bias=(*params.logit_bias, *banned))


class Sampler:
    """One sequence's sampling state: its params (clamped), RNG and generated-token counts."""

    def __init__(self, params: SamplingParams):
        self.params = params
        # Any integer seeds (numpy refuses negative ones); non-negative ones are kept as is.
        seed = None if params.seed is None else params.seed % (1 << 128)
        self.rng = np.random.default_rng(seed)

        t = _clamp(params.temperature, 0.0, _FMAX, 0.0)
        self.greedy = t <= 0.0
        self.temperature = 1.0 if self.greedy else t
        self.top_k = max(int(params.top_k), 0)
        self.top_p = _clamp(params.top_p, 0.0, 1.0, 1.0)
        self.min_p = _clamp(params.min_p, 0.0, 1.0, 0.0)
        self.presence = _clamp(params.presence_penalty, -2.0, 2.0, 0.0)
        self.frequency = _clamp(params.frequency_penalty, -2.0, 2.0, 0.0)
        r = float(params.repetition_penalty)
        self.repetition = min(r, _FMAX) if r > 0.0 else 1.0  # NaN and r <= 0 disable it
        self.penalised = self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

        bias: dict[int, float] = {}  # a repeated id: the last one wins, as in a JSON object
        for token_id, b in params.logit_bias:
            if 0 <= int(token_id) <= _IMAX and not math.isnan(float(b)):
                # -inf bans the token (ignore_eos; the HTTP edge clamps clients' to -100).
                banned = float(b) == -math.inf
                bias[int(token_id)] = -math.inf if banned else _clamp(b, -100.0, 100.0, 0.0)
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.bias_values = np.fromiter(bias.values(), dtype=np.float64, count=len(bias))

        self.top_logprobs = int(_clamp(params.top_logprobs, 0, MAX_TOP_LOGPROBS, 0))
        self.logprobs = bool(params.logprobs) or self.top_logprobs > 0
        # Greedy with nothing that moves a logit or reports one, but bans (ignore_eos): the
        # argmax of the raw row is the token unless it is banned (sample_batch's shortcut;
        # the transforms keep the order, and a ban only removes tokens). A B = 8 step of
        # ignore_eos streams spent ~6 % of the engine thread in the full float64 path.
        bans_only = bool(np.all(self.bias_values == -math.inf))
        self.plain_greedy = self.greedy and not self.penalised and bans_only and not self.logprobs
        self.banned = frozenset(int(i) for i in self.bias_ids) if bans_only else frozenset()

        # Generated tokens for the penalties: id -> index into the first len(_seen) entries
        # of _ids/_counts, grown by doubling so accept() is O(1).
        self._seen: dict[int, int] = {}
        self._ids = np.empty(0, dtype=np.int64)
        self._counts = np.empty(0, dtype=np.float64)

    def accept(self, token_id: int) -> None:
        """Record a generated token (the penalties count them)."""
        if not self.penalised or not 0 <= token_id <= _IMAX:
            return
        i = self._seen.get(token_id)
        if i is None:
            i = self._seen[token_id] = len(self._seen)
            if i == len(self._ids):
                grow = max(16, len(self._ids))
                self._ids = np.concatenate((self._ids, np.empty(grow, dtype=np.int64)))
                self._counts = np.concatenate((self._counts, np.empty(grow, dtype=np.float64)))
            self._ids[i], self._counts[i] = token_id, 0.0
        self._counts[i] += 1.0

    def generated_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, counts) of the generated tokens recorded so far (only when penalised)."""
        n = len(self._seen)
        return self._ids[:n], self._counts[:n]

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> Sample:
        """Sample one token from logits (V,); mask (V,) bool allows a subset (a grammar).
        Raises ValueError when the mask allows nothing. Does not accept() the token."""
        logits = np.asarray(logits)
        if logits.ndim != 1:
            raise ValueError(f"logits must be (V,), got {logits.shape}")
        return sample_batch([self], logits[None, :], [mask])[0]

    def __call__(self, logits: np.ndarray) -> int:
        token_id = self.sample(logits).token_id
        self.accept(token_id)
        return token_id

    def _draw(self, z: np.ndarray, e: np.ndarray | None, total: float) -> int:
        """Draw from z (V,): logits after steps 1-5, shifted so the largest is 0. e and
        total: exp(z) and its sum, given when top_k does not apply."""
        V = len(z)
        cand: np.ndarray | None = None  # ids most likely first; None: all of them, id order
        if 0 < self.top_k < V:
            cand = apply_top_k(z, self.top_k)
            weights = np.exp(z[cand])
            total = float(weights.sum())
        elif self.min_p > 0.0 or self.top_p < 1.0:
            # Sort only the tokens that can survive: min_p needs exp(z) >= min_p (the largest
            # is exp(0) = 1); tokens under (1 - top_p) / V of the mass hold less than 1 - top_p
            # together, so the nucleus lies among the others. The slack absorbs rounding.
            floor = -np.inf
            if self.min_p > 0.0:
                floor = math.log(self.min_p)
            if self.top_p < 1.0:
                floor = max(floor, math.log(total * (1.0 - self.top_p) / V))
            cand = np.flatnonzero(z >= floor - 1e-9)
            cand = cand[np.lexsort((cand, -z[cand]))]
            weights = e[cand]
        else:
            weights = e
        n = len(weights)
        if cand is not None:
            # Sorted most likely first: masked (-inf) tokens are a zero-weight tail.
            n = min(
                apply_top_p(weights / total, self.top_p),
                apply_min_p(weights, self.min_p),
                int(np.count_nonzero(weights > 0.0)),
            )
        j = _pick(weights[:n], self.rng.random())
        return j if cand is None else int(cand[j])

    def _top(self, z: np.ndarray, log_total: float) -> tuple[tuple[int, float], ...]:
        if not self.top_logprobs:
            return ()
        ids = apply_top_k(z, min(self.top_logprobs, len(z)))
        values = z[ids] - log_total
        return tuple((int(i), float(v)) for i, v in zip(ids, values, strict=True) if v > -np.inf)


def _pick(weights: np.ndarray, u: float) -> int:
    """Index i with probability weights[i] / sum for a uniform u in [0, 1), never a zero
    weight. A long vector (a whole vocabulary) first picks a block of _PICK_BLOCK by the
    blocks' sums: a cumsum over V costs ~5 ns an element, a blocked sum a tenth of that."""
    n = len(weights)
    if n <= _PICK_BLOCK:
        return _pick_cdf(np.cumsum(weights), u)
    whole = n - n % _PICK_BLOCK
    sums = weights[:whole].reshape(-1, _PICK_BLOCK).sum(axis=1)
    if whole < n:
        sums = np.append(sums, weights[whole:].sum())
    cdf = np.cumsum(sums)
    cdf /= cdf[-1]
    b = _pick_cdf(cdf, u, normalised=True)
    below = cdf[b - 1] if b else 0.0
    # u's place inside block b, in [0, 1): rounding may reach 1, which no token has.
    inner = min((u - below) / (cdf[b] - below), _BELOW_ONE)
    start = b * _PICK_BLOCK
    return start + _pick_cdf(np.cumsum(weights[start : start + _PICK_BLOCK]), inner)


def _pick_cdf(cdf: np.ndarray, u: float, normalised: bool = False) -> int:
    """As Generator.choice: the first entry of the normalised CDF above u. Its last entry is
    exactly 1 > u and a zero weight repeats its predecessor, so neither is ever reached."""
    if not normalised:
        cdf /= cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))


def _gather(samplers: list[Sampler], V: int, what) -> tuple[np.ndarray, ...] | None:
    """Concatenate each row's sparse (ids, values...) from what(sampler) into
    (rows, ids, values...) for one fancy-indexed update over the whole batch."""
    parts = []
    for row, s in enumerate(samplers):
        got = what(s)
        if got is None or not len(got[0]):
            continue
        keep = got[0] < V
        parts.append((np.full(int(keep.sum()), row), *(a[keep] for a in got)))
    if not parts:
        return None
    return tuple(np.concatenate(cols) for cols in zip(*parts, strict=True))


def apply_logit_bias(x: np.ndarray, samplers: list[Sampler]) -> None:
    """Step 1 on (B, V) logits, in place."""
    got = _gather(samplers, x.shape[1], lambda s: (s.bias_ids, s.bias_values))
    if got is not None:
        rows, ids, bias = got
        # A bias of -inf (a ban) is set, not added: +inf + -inf is NaN, and a NaN row
        # would hand the banned id its share again.
        ban = bias == -np.inf
        x[rows[~ban], ids[~ban]] += bias[~ban]
        x[rows[ban], ids[ban]] = -np.inf


def _penalty_terms(s: Sampler) -> tuple[np.ndarray, ...] | None:
    """(ids, counts, repetition, presence, frequency) per generated token, for _gather (the
    device sampler, device_sampling.py, gathers the same)."""
    if not s.penalised:
        return None
    ids, counts = s.generated_counts()
    n = len(ids)
    return ids, counts, np.full(n, s.repetition), np.full(n, s.presence), np.full(n, s.frequency)


def apply_penalties(x: np.ndarray, samplers: list[Sampler]) -> None:
    """Steps 2 and 3 on (B, V) logits, in place, over each row's generated tokens."""
    got = _gather(samplers, x.shape[1], _penalty_terms)
    if got is None:
        return
    rows, ids, counts, rep, presence, frequency = got
    v = x[rows, ids]
    v = np.where(v > 0.0, v / rep, v * rep)
    v -= presence + frequency * counts  # every recorded token has count > 0
    x[rows, ids] = v


def _allowed(mask, V: int) -> np.ndarray | None:
    if mask is None:
        return None
    allowed = np.asarray(mask, dtype=bool)
    if allowed.shape != (V,):
        raise ValueError(f"mask must be ({V},), got {allowed.shape}")
    if not allowed.any():
        raise ValueError("the mask allows no token")
    return allowed


def _apply_transforms(x: np.ndarray, samplers: list[Sampler], allowed: list) -> None:
    """Steps 1-5 on (B, V) float64 logits, in place, leaving each row's largest at 0."""
    B = len(samplers)
    apply_logit_bias(x, samplers)
    apply_penalties(x, samplers)
    masked = [i for i in range(B) if allowed[i] is not None]
    if masked:
        keep = np.stack([allowed[i] for i in masked])
        if len(masked) == B:
            np.copyto(x, -np.inf, where=~keep)
        else:
            x[masked] = np.where(keep, x[masked], -np.inf)

    top = x.max(axis=1)
    for i in np.flatnonzero(~np.isfinite(top)):
        # No usable logit: +inf ones share the mass; with none (all -inf, or a NaN), the
        # allowed tokens do.
        if top[i] == np.inf:
            x[i] = np.where(x[i] == np.inf, 0.0, -np.inf)
        else:
            x[i] = 0.0 if allowed[i] is None else np.where(allowed[i], 0.0, -np.inf)
        top[i] = 0.0
    x -= top[:, None]  # the largest is 0: exp never overflows, no inf - inf ever arises
    temperature = np.array([s.temperature for s in samplers])
    if (temperature != 1.0).any():
        x /= temperature[:, None]


def sample_batch(
    samplers: list[Sampler], logits: np.ndarray, masks: list[np.ndarray | None] | None = None
) -> list[Sample]:
    """Sample one token per row of logits (B, V) with samplers[i] and masks[i]. Row i's
    Sample is identical to samplers[i].sample(logits[i], masks[i]). Raises ValueError (before
    any RNG moves) when a mask allows nothing. Does not accept() the tokens."""
    logits = np.asarray(logits)
    B = len(samplers)
    if logits.ndim != 2 or logits.shape[0] != B:
        raise ValueError(f"logits must be ({B}, V), got {logits.shape}")
    V = logits.shape[1]
    masks = [None] * B if masks is None else list(masks)
    if len(masks) != B:
        raise ValueError(f"{len(masks)} masks for {B} rows")
    allowed = [_allowed(m, V) for m in masks]
    if B == 0:
        return []
    out: list[Sample | None] = [None] * B
    rest = []
    for i, s in enumerate(samplers):
        if s.plain_greedy and allowed[i] is None:
            # The transforms (float64, minus the row's largest) keep every finite row's
            # order, so its argmax is theirs; a row whose largest is not finite (+inf,
            # NaN, all -inf) takes the full path, which says what those mean.
            # A banned argmax takes the full path too: the largest allowed token is another.
            token = int(np.argmax(logits[i]))
            if np.isfinite(logits[i, token]) and token not in s.banned:
                out[i] = Sample(token)
                continue
        rest.append(i)
    if rest:
        picked = [samplers[i] for i in rest]
        rows = logits if len(rest) == B else logits[rest]
        sampled = _sample_rows(picked, rows, [allowed[i] for i in rest])
        for i, sample in zip(rest, sampled, strict=True):
            out[i] = sample
    return out  # type: ignore[return-value]


def _sample_rows(samplers: list[Sampler], logits: np.ndarray, allowed: list) -> list[Sample]:
    """sample_batch's full path: every transform, float64, over the rows given."""
    B, V = logits.shape
    x = np.array(logits, dtype=np.float64)  # a copy: every step below works in place
    with np.errstate(over="ignore"):  # an extreme penalty or temperature overflows to -inf
        _apply_transforms(x, samplers, allowed)
    # exp and its row sums, for rows that report logprobs or draw without top_k.
    need = [i for i, s in enumerate(samplers) if s.logprobs or not (s.greedy or 0 < s.top_k < V)]
    row_of = {i: j for j, i in enumerate(need)}
    e = np.exp(x if len(need) == B else x[need])  # (len(need), V)
    totals = e.sum(axis=1)
    log_totals = np.log(totals)

    out = []
    for i, s in enumerate(samplers):
        z, j = x[i], row_of.get(i)
        if s.greedy:
            token = int(np.argmax(z))
        elif j is None:
            token = s._draw(z, None, 0.0)
        else:
            token = s._draw(z, e[j], float(totals[j]))
        if s.logprobs:
            lt = float(log_totals[j])
            out.append(Sample(token, float(z[token] - lt), s._top(z, lt)))
        else:
            out.append(Sample(token))
    return out


def forced_sample(sampler: Sampler, logits: np.ndarray, token_id: int) -> Sample:
    """A token chosen for the sampler rather than drawn (a forced `</think>`), with its
    log-probability under the same distribution a draw would have used (no mask) when
    the sampler reports logprobs. Moves no RNG."""
    if not sampler.logprobs:
        return Sample(token_id)
    x = np.array(np.asarray(logits)[None], dtype=np.float64)
    with np.errstate(over="ignore"):
        _apply_transforms(x, [sampler], [None])
    z = x[0]
    log_total = float(np.log(np.exp(z).sum()))
    return Sample(token_id, float(z[token_id] - log_total), sampler._top(z, log_total))
