"""Work the engine thread runs beside generation: embeddings and prompt scoring.

Each is a job (a generator the engine thread advances one prefill chunk per step, between
its generation steps: service.ModelService.submit), on a scratch KV cache the size of the
input, so nothing is kept once it ends. An input is always cut into the same chunks and
computed alone, so its result is the same bits alone or in a batch.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np

POOLINGS = ("mean", "last", "cls")
# Forward passes an embedding job runs before it yields, whatever their length: a pass
# costs about one read of the weights even for a few tokens, so 256 tokens of 8-token
# inputs are 32 passes (a decode step's time each) and would hold generation and every
# other job for as long as 32 steps. One pass a step: a prompt arriving while an
# embedding flood runs waits for one short pass, not four, before its prefill (the
# victim's first token under a 256-input embedding flood: 0.11-0.12 s against 0.16-0.20
# s with 4, idle 0.07 s; bench/RESULTS.md); alone, the job's steps run back to back.
PASSES_PER_STEP = 1
# Measured on the shipped models (tests/engine/serving/test_embedding.py, bench/RESULTS.md): on
# SmolLM2 (llama) mean pooling separates paraphrases from unrelated pairs best, on
# gemma-3-270m the last token's state does. `cls` (the first token) is for encoders: in a
# causal model it has seen nothing else (with a BOS, every input gets the same vector).
DEFAULT_POOLING = "mean"
ARCH_POOLING: dict[str, str] = {"gemma3": "last"}


def default_pooling(architecture: str) -> str:
    return ARCH_POOLING.get(architecture, DEFAULT_POOLING)


def embed_job(
    model, token_lists: Sequence[Sequence[int]], pooling: str, chunk: int
) -> Generator[None, None, np.ndarray]:
    """(N, D) float32 rows, L2-normalised: each input's final-normed hidden states pooled
    (`mean` over its tokens, `last` token, `cls` the first token). Yields once about
    `chunk` tokens have run (a chunk of a long input, or several short inputs), or after
    PASSES_PER_STEP passes, whichever comes first."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling: expected one of {', '.join(POOLINGS)}, got {pooling!r}")
    out = np.zeros((len(token_lists), model.hp.d_model), dtype=np.float32)
    ran = passes = 0  # tokens and forward passes since the last yield
    for i, ids in enumerate(token_lists):
        kv = model.make_kv_cache(1, len(ids))  # scratch: dropped with this input
        total = np.zeros(model.hp.d_model, dtype=np.float64)
        for start in range(0, len(ids), chunk):
            h = model.hidden_states(np.asarray(ids[start : start + chunk]), start, kv, 0)
            if pooling == "mean":
                total += h.sum(axis=0, dtype=np.float64)
            elif pooling == "cls" and start == 0:
                total = h[0].astype(np.float64)
            elif pooling == "last":
                total = h[-1].astype(np.float64)
            ran += len(h)
            passes += 1
            if ran >= chunk or passes >= PASSES_PER_STEP:
                ran = passes = 0
                yield
        if pooling == "mean":
            total /= len(ids)
        norm = np.linalg.norm(total)
        out[i] = total / norm if norm > 0 else total
    return out


LOGITS_BUDGET = 16 << 20  # logits (rows x vocabulary) one scoring pass may hold: 64 MB
SCORE_ROWS = 16  # rows turned into float64 at a time


def score_job(
    model, ids: Sequence[int], top_n: int, chunk: int
) -> Generator[None, None, list[tuple[float, tuple[tuple[int, float], ...]]]]:
    """The log-probability of each token of `ids` after the ones before it (raw logits,
    temperature 1), with the `top_n` most likely ids at that position: one entry per
    token from the second on. Chunks are cut so that a pass's logits stay within
    LOGITS_BUDGET (a 262k vocabulary scores 64 tokens a pass). Yields after each."""
    chunk = max(1, min(chunk, LOGITS_BUDGET // model.hp.vocab_size))
    kv = model.make_kv_cache(1, len(ids))
    out: list[tuple[float, tuple[tuple[int, float], ...]]] = []
    for start in range(0, len(ids), chunk):
        part = np.asarray(ids[start : start + chunk])
        logits = model.forward(part, start, kv, 0, all_logits=True)  # (T, V)
        rows = min(len(part), len(ids) - start - 1)  # the last token predicts nothing here
        for r0 in range(0, max(rows, 0), SCORE_ROWS):
            r1 = min(rows, r0 + SCORE_ROWS)
            out.extend(_scores(logits[r0:r1], ids[start + 1 + r0 : start + 1 + r1], top_n))
        yield
    return out


def _scores(logits, targets, top_n: int) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    z = logits.astype(np.float64)
    peak = z.max(axis=1, keepdims=True)
    log_total = peak[:, 0] + np.log(np.exp(z - peak).sum(axis=1))
    picked = z[np.arange(len(z)), np.asarray(targets)] - log_total
    best = None
    if top_n > 0:
        k = min(top_n, z.shape[1])
        best = np.argpartition(-z, k - 1, axis=1)[:, :k]
    out = []
    for t in range(len(z)):
        top: tuple[tuple[int, float], ...] = ()
        if best is not None:
            cand = sorted(best[t].tolist(), key=lambda j, zt=z[t]: (-zt[j], j))
            top = tuple((int(j), float(z[t, j] - log_total[t])) for j in cand)
        out.append((float(picked[t]), top))
    return out
