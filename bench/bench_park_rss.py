"""Process memory of kept sessions: RSS after N two-turn sessions of ~1.9k tokens each.

Each session: turn 1 a ~1,900-token prompt (a long system document and a question, 16
tokens answered), turn 2 that history plus a follow-up (4 tokens). The sessions stay
parked; with the default 4 slots a quarter (one) keeps a parked conversation in its slot,
the others go to host memory at the bound, lazy or not (slot_cache.py). Reported: RSS before the first session and after each one, the peak (ru_maxrss),
and the bytes of the parked conversations held as host copies beside the slots (0 when
parking is lazy: engine/serving/conversation.py). `--eager` copies every conversation
out at once, as before lazy parking (the KV cache is told it is not host-readable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from bench.bench_sessions import document, run_turn, turn_1  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import ModelConfig  # noqa: E402

MB = 1 << 20


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / MB


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def sessions(svc: ModelService, n: int, tokens: int) -> dict:
    doc = document(svc, tokens)
    out = {"rss_before_mb": round(rss_mb(), 1), "rss_after_mb": [], "cached_tokens": []}
    out["turn2_ttft_s"] = []
    for i in range(n):
        first = turn_1(f"Session {i}.\n{doc}")
        answer, _, _ = await run_turn(svc, first, f"rss-{i}", 16)
        second = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And what is sold on market days?"},
        ]
        _, ttft, cached = await run_turn(svc, second, f"rss-{i}", 4)
        out["turn2_ttft_s"].append(round(ttft, 3))
        await asyncio.sleep(0.5)  # the engine idles and trims its heap first (threads.trim)
        out["rss_after_mb"].append(round(rss_mb(), 1))
        out["cached_tokens"].append(cached)
    convs = [c for _, c, *_ in svc.sessions.conversations()]
    out["turn2_tokens"] = max(c.n_tok for c in convs)
    out["parked_kv_mb"] = round(sum(c.nbytes for c in convs) / MB, 1)
    out["host_copies_mb"] = round(sum(getattr(c, "host_bytes", c.nbytes) for c in convs) / MB, 1)
    out["peak_rss_mb"] = round(peak_mb(), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: the shipped SmolLM2)")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1900, help="turn-1 prompt size")
    parser.add_argument("--max-sessions", type=int, default=4, help="slots: a quarter keep")
    parser.add_argument("--eager", action="store_true", help="copy conversations out at once")
    args = parser.parse_args()
    path = str(args.model or default_model_path())
    svc = ModelService.load(ModelConfig(name="bench", path=path, max_sessions=args.max_sessions))
    if args.eager:
        svc.kv.host_readable = False
    try:
        result = asyncio.run(sessions(svc, args.sessions, args.tokens))
    finally:
        svc.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
