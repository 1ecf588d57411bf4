"""Interactive time to first token beside a batch (the Batches API's priority classes).

One ModelService: the median TTFT of `--interactive` short greedy requests on the idle
engine, then again while `--lines` short batch-class requests keep every slot busy (a
pool of twice the slots, refilled as each ends). The issue's bar: within 1.5x of idle,
and the batch still completes. Engine level (no HTTP): what the scheduler's parking buys.

    python bench/bench_batch_priority.py --lines 2000 --interactive 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import GenerationRequest, ModelConfig, SamplingParams, TokenEvent  # noqa: E402


async def first_token_s(svc: ModelService, prompt: tuple[int, ...], priority: str) -> float:
    start, first = time.monotonic(), None
    request = GenerationRequest(
        "b", prompt, SamplingParams(temperature=0, max_tokens=8), priority=priority
    )
    async for event in svc.generate(request):
        if first is None and isinstance(event, TokenEvent):
            first = time.monotonic() - start
    return first if first is not None else time.monotonic() - start


async def interactive_ttfts(svc: ModelService, prompt, n: int) -> list[float]:
    return [await first_token_s(svc, prompt, "interactive") for _ in range(n)]


async def with_batch(svc: ModelService, prompt, lines: int, n: int):
    todo = list(range(lines))
    done = 0

    async def worker():
        nonlocal done
        while todo:
            todo.pop()
            await first_token_s(svc, prompt, "batch")
            done += 1

    workers = [asyncio.create_task(worker()) for _ in range(2 * svc.max_concurrent)]
    while svc.slots_busy < svc.max_concurrent:
        await asyncio.sleep(0.01)
    ttfts = await interactive_ttfts(svc, prompt, n)
    await asyncio.gather(*workers)
    return ttfts, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(default_model_path()))
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--interactive", type=int, default=20)
    args = parser.parse_args()
    svc = ModelService.load(
        ModelConfig(name="bench", path=args.model, max_concurrent=args.slots, prefix_cache=False)
    )
    prompt = tuple(svc.encode_chat([{"role": "user", "content": "Name a colour."}]))
    try:
        idle = asyncio.run(interactive_ttfts(svc, prompt, args.interactive))
        busy, done = asyncio.run(with_batch(svc, prompt, args.lines, args.interactive))
    finally:
        svc.close()
    idle_s, busy_s = statistics.median(idle), statistics.median(busy)
    print(f"idle TTFT median {idle_s * 1000:.1f} ms, beside the batch {busy_s * 1000:.1f} ms")
    print(f"ratio {busy_s / idle_s:.2f} (bar: 1.5); batch lines done {done}/{args.lines}")


if __name__ == "__main__":
    main()
