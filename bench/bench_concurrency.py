"""Aggregate decode throughput at 1, 2, 4 and 8 concurrent streams (continuous batching).

Each level starts `c` greedy generations at once on one ModelService with eight slots and
counts, over the engine's decode passes that carried all `c` streams, tokens per second
of compute (prefill excluded), plus the end-to-end rate (tokens / wall time, prefill
included). The ratio to one stream is the point: a decode pass is bandwidth-bound, so
c rows cost much less than c passes. The peer is llama-server with 8 streams on a 2-core
machine (120 tok/s total).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import GenerationRequest, ModelConfig, SamplingParams  # noqa: E402

PEER_8_STREAMS_TOK_S = 120.0
LEVELS = (1, 2, 4, 8)


def spy_on_decode_passes(svc: ModelService) -> list[tuple[int, float]]:
    """(rows, seconds) of every decode pass the engine runs from now on."""
    passes: list[tuple[int, float]] = []
    real_run = svc.runner.run

    def run(batch, samplers):
        sampled = real_run(batch, samplers)
        t = svc.runner.last
        if t.decode_rows:
            passes.append((t.decode_rows, t.decode_s))
        return sampled

    svc.runner.run = run
    return passes


async def generate(svc: ModelService, prompt: list[int], max_tokens: int) -> int:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    n = 0
    async for ev in svc.generate(GenerationRequest("bench", tuple(prompt), params)):
        n = getattr(getattr(ev, "usage", None), "completion_tokens", n)
    return n


def measure(svc: ModelService, passes: list, c: int, max_tokens: int) -> dict:
    prompts = [
        svc.encode_chat(
            [{"role": "user", "content": f"Count from {i + 1} to 1000, separated by commas."}]
        )
        for i in range(c)
    ]

    async def together():
        return await asyncio.gather(*(generate(svc, p, max_tokens) for p in prompts))

    passes.clear()
    started = time.perf_counter()
    tokens = sum(asyncio.run(together()))
    wall = time.perf_counter() - started
    full = [(rows, s) for rows, s in passes if rows == c]
    decode = sum(r for r, _ in full) / sum(s for _, s in full)
    return {
        "streams": c,
        "decode_tok_s": round(decode, 1),
        "per_stream_tok_s": round(decode / c, 1),
        "step_ms": round(1000 * sum(s for _, s in full) / len(full), 1),
        "end_to_end_tok_s": round(tokens / wall, 1),
        "tokens": tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode-tokens", type=int, default=64, help="tokens per stream")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    svc = ModelService.load(ModelConfig(name="bench", path=default_model_path(), max_concurrent=8))
    passes = spy_on_decode_passes(svc)
    measure(svc, passes, 2, 8)  # warm-up: page in the weights and the KV pages
    load_before = os.getloadavg()[0]
    results = [measure(svc, passes, c, args.decode_tokens) for c in LEVELS]
    svc.close()
    base = results[0]["decode_tok_s"]
    for r in results:
        r["ratio_to_1"] = round(r["decode_tok_s"] / base, 2)
    if args.json:
        print(json.dumps({"load_avg_1m": load_before, "results": results}))
        return
    print(
        f"{args.decode_tokens} greedy tokens per stream; 1-min load average before: {load_before:.2f}"
    )
    print("streams  decode tok/s  x 1 stream  per stream  step ms  end-to-end tok/s")
    for r in results:
        print(
            f"{r['streams']:7d}  {r['decode_tok_s']:12.1f}  {r['ratio_to_1']:10.2f}"
            f"  {r['per_stream_tok_s']:10.1f}  {r['step_ms']:7.1f}  {r['end_to_end_tok_s']:16.1f}"
        )
    eight = results[-1]["decode_tok_s"]
    print(
        f"8 streams: {eight / PEER_8_STREAMS_TOK_S:.2f}x llama-server ({PEER_8_STREAMS_TOK_S:.0f} tok/s)"
    )


if __name__ == "__main__":
    main()
