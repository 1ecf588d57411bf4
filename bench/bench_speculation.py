"""Exact speculative decoding (issue 31): decode tok/s of the default model on a "print
this text again" request with speculation off, auto (prompt lookup) and with the answer
as its prediction, and the aggregate of 8 concurrent streams off vs auto. Every ratio is
of two figures measured in this run; the tokens are checked equal (speculation never
changes them).

    python bench/bench_speculation.py [--tokens 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import (  # noqa: E402
    FinishEvent,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    TokenEvent,
)

TEXT = """def merge_sorted(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result


def merge_sort(items):
    if len(items) <= 1:
        return items
    middle = len(items) // 2
    return merge_sorted(merge_sort(items[:middle]), merge_sort(items[middle:]))
"""
TOPICS = ["the sea", "a cat", "mountains", "coffee", "the moon", "a library", "rain", "trains"]


async def one(svc, prompt, params, **spec):
    """(token ids, FinishEvent, wall seconds)."""
    ids, finish = [], None
    started = time.perf_counter()
    async for ev in svc.generate(GenerationRequest("b", tuple(prompt), params, **spec)):
        if isinstance(ev, TokenEvent):
            ids.extend(ev.token_ids)
        elif isinstance(ev, FinishEvent):
            finish = ev
    return ids, finish, time.perf_counter() - started


def decode_rate(finish: FinishEvent) -> float:
    """Tokens after the first per second of decoding."""
    return max(finish.usage.completion_tokens - 1, 1) / max(finish.decode_s, 1e-9)


def single(svc, prompt, params, repeats: int) -> dict[str, float]:
    """Best decode tok/s of each mode, the modes alternated in every repeat (a shared
    host's noise hits them alike)."""
    modes = ("off", "auto", "prediction")
    best = dict.fromkeys(modes, 0.0)
    counts: dict[str, tuple[int, int, int]] = {}
    off_ids, _, _ = asyncio.run(one(svc, prompt, params, speculation="off"))  # warm-up
    for _ in range(repeats):
        for mode in modes:
            before = (svc.stats.drafted_tokens, svc.stats.accepted_draft_tokens)
            spec = {"off": {"speculation": "off"}, "auto": {}}.get(mode)
            ids, finish, _ = asyncio.run(
                one(
                    svc,
                    prompt,
                    params,
                    **(spec if spec is not None else {"prediction": tuple(off_ids)}),
                )
            )
            if ids != off_ids:
                sys.exit(f"speculation {mode} changed the tokens: a bug")
            best[mode] = max(best[mode], decode_rate(finish))
            drafted = svc.stats.drafted_tokens - before[0]
            counts[mode] = (len(ids), drafted, svc.stats.accepted_draft_tokens - before[1])
    for mode in modes:
        n, drafted, accepted = counts[mode]
        rate = f", drafted {drafted}, accepted {accepted}" if drafted else ""
        print(f"  {mode:10s} {best[mode]:7.1f} tok/s ({n} tokens{rate})")
    return best


def streams(svc, prompts, params, speculation: str) -> tuple[float, list]:
    async def together():
        return await asyncio.gather(
            *(one(svc, p, params, speculation=speculation) for p in prompts)
        )

    started = time.perf_counter()
    results = asyncio.run(together())
    wall = time.perf_counter() - started
    tokens = sum(f.usage.completion_tokens for _, f, _ in results)
    return tokens / wall, [ids for ids, _, _ in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-draft", type=int, default=0, help="0: the model's default")
    parser.add_argument("--single", action="store_true", help="skip the 8 streams")
    args = parser.parse_args()
    path = args.model or default_model_path()
    config = ModelConfig(name="bench", path=path, max_concurrent=8)
    if args.max_draft:
        config = replace(config, spec_max_draft=args.max_draft)
    svc = ModelService.load(config)
    try:
        params = SamplingParams(temperature=0, max_tokens=args.tokens)
        prompt = svc.encode_chat(
            [
                {
                    "role": "user",
                    "content": f"Print this file again, unchanged:\n\n```python\n{TEXT}```",
                }
            ]
        )
        print(f"single stream, 'print this file again' ({args.tokens} tokens max):")
        rates = single(svc, prompt, params, args.repeats)
        print(
            f"  auto / off = {rates['auto'] / rates['off']:.2f}x, "
            f"prediction / off = {rates['prediction'] / rates['off']:.2f}x"
        )
        if args.single:
            return
        prompts = [
            svc.encode_chat([{"role": "user", "content": f"Write about {t}."}]) for t in TOPICS
        ]
        many = SamplingParams(temperature=0, max_tokens=64)
        streams(svc, prompts, many, "off")  # warm-up
        off = auto = 0.0
        for _ in range(args.repeats):  # alternated: a shared host's noise hits both alike
            rate, off_ids = streams(svc, prompts, many, "off")
            off = max(off, rate)
            rate, auto_ids = streams(svc, prompts, many, "auto")
            auto = max(auto, rate)
            if off_ids != auto_ids:
                sys.exit("speculation changed the tokens of the 8 streams: a bug")
        print(f"8 streams: off {off:.1f} tok/s, auto {auto:.1f} tok/s: {auto / off:.2f}x")
    finally:
        svc.close()


if __name__ == "__main__":
    main()
