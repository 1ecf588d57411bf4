"""Decode tokens/s with and without a JSON-schema constraint: the grammar's overhead.

The same prompt is decoded greedily for `--tokens` tokens (end of turn banned, so both
runs decode the same count), first unconstrained, then with
a nested JSON schema enforced by llguidance (a token mask per step, the sampler drawing
only allowed tokens). Both runs count decode steps only (prefill excluded), one stream,
median of `--repeat` runs. The ratio constrained / unconstrained is the point: the mask
costs well under a millisecond against a ~30 ms forward pass on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from engine.decoding.constraints import plan_response_format  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import (  # noqa: E402
    FinishEvent,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    TokenEvent,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "pets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"enum": ["cat", "dog", "bird"]},
                    "age": {"type": "integer"},
                },
                "required": ["name", "kind", "age"],
            },
        }
    },
    "required": ["pets"],
}
PROMPT = [{"role": "user", "content": "List many pets as JSON: name, kind and age of each."}]


async def decode_rate(svc: ModelService, ids, plan, tokens: int) -> tuple[float, int]:
    """(decode tokens/s after the first token, tokens produced)."""
    # End of turn banned in both runs, so both decode exactly `tokens` tokens.
    no_end = tuple((t, -100.0) for t in svc.tokenizer.end_of_turn_ids)
    params = SamplingParams(temperature=0, max_tokens=tokens, logit_bias=no_end)
    request = GenerationRequest(
        "bench",
        tuple(ids),
        params,
        constraint=plan,
        format_status="applied" if plan else None,
    )
    first = None
    n = 0
    async for ev in svc.generate(request):
        if isinstance(ev, TokenEvent) and first is None:
            first = time.perf_counter()
        if isinstance(ev, FinishEvent):
            n = ev.usage.completion_tokens
    elapsed = time.perf_counter() - first
    return (n - 1) / elapsed, n


async def measure(svc: ModelService, tokens: int, repeat: int) -> dict:
    ids = svc.encode_chat(PROMPT)
    plan = plan_response_format(
        {"type": "json_schema", "json_schema": {"name": "pets", "schema": SCHEMA}}
    )
    await decode_rate(svc, ids, plan, 8)  # warm-up: builds the grammar tokenizer once
    free, constrained, counts = [], [], []
    for _ in range(repeat):
        rate, n = await decode_rate(svc, ids, None, tokens)
        free.append(rate)
        rate, n2 = await decode_rate(svc, ids, plan, tokens)
        constrained.append(rate)
        counts.append((n, n2))
    free_rate, constrained_rate = statistics.median(free), statistics.median(constrained)
    return {
        "tokens": counts[-1],
        "unconstrained_tok_s": round(free_rate, 1),
        "json_schema_tok_s": round(constrained_rate, 1),
        "ratio": round(constrained_rate / free_rate, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: the shipped SmolLM2)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    svc = ModelService.load(ModelConfig(name="bench", path=str(args.model or default_model_path())))
    try:
        result = asyncio.run(measure(svc, args.tokens, args.repeat))
    finally:
        svc.close()
    if args.json:
        print(json.dumps(result))
        return
    print(f"tokens decoded (free, constrained): {result['tokens']}")
    print(f"decode, unconstrained   {result['unconstrained_tok_s']:.1f} tok/s")
    print(f"decode, json_schema     {result['json_schema_tok_s']:.1f} tok/s")
    print(f"ratio                   {result['ratio']:.3f} (1.0 = no grammar overhead)")


if __name__ == "__main__":
    main()
