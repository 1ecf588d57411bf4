"""Time to first token of a conversation's second turn, with and without the session cache.

Turn 1 is a ~1,500-token prompt (a long system document and a question) answered with
a session id. Turn 2 appends the answer and a follow-up question. Cold: turn 2 sent
without a session id, so the whole prompt is prefilled. Warm: turn 2 under the session
id, so only the new tokens are prefilled (the rest is copied from the parked KV).
TTFT is measured at the engine (generate() call to the first token event), median of
`--repeat` runs, each warm run on a fresh session. The peer is llama-server: 0.4 s to
first token on a cached 1.9k-token second turn.
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
from engine.serving.service import ModelService  # noqa: E402
from engine.types import (  # noqa: E402
    FinishEvent,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    TokenEvent,
)

PEER_CACHED_TTFT_S = 0.4  # llama-server, cached 1.9k-token second turn, same machine
FACTS = [
    "The harbour town keeps its lighthouse lit from dusk until the fishing boats return.",
    "Every spring the river floods the lower meadows and the farmers move their sheep.",
    "The library holds four thousand maps, most of them drawn by hand before 1850.",
    "A narrow railway climbs the valley, stopping at seven villages on the way up.",
    "The old mill was turned into a bakery that sells rye bread and apple cake.",
    "On market days the square fills with stalls of cheese, honey and wool.",
]


def document(svc: ModelService, tokens: int) -> str:
    """Numbered facts until the rendered turn-1 prompt holds about `tokens` tokens."""
    lines: list[str] = []
    i = 0
    while len(svc.encode_chat(turn_1("\n".join(lines)))) < tokens:
        lines.append(f"{i + 1}. {FACTS[i % len(FACTS)]}")
        i += 1
    return "\n".join(lines)


def turn_1(doc: str) -> list[dict]:
    return [
        {"role": "system", "content": "Answer questions about this town record:\n" + doc},
        {"role": "user", "content": "What does the old mill sell?"},
    ]


async def run_turn(svc: ModelService, messages, session_id, max_tokens) -> tuple[str, float, int]:
    """(answer, seconds to first token, cached tokens)."""
    ids = svc.encode_chat(messages)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    request = GenerationRequest("bench", tuple(ids), params, session_id=session_id)
    t0 = time.perf_counter()
    ttft, parts, cached = None, [], 0
    async for ev in svc.generate(request):
        if isinstance(ev, TokenEvent):
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            parts.append(ev.text)
        elif isinstance(ev, FinishEvent):
            cached = ev.usage.cached_tokens
            ttft = ttft if ttft is not None else time.perf_counter() - t0
    return "".join(parts), ttft, cached


async def measure(svc: ModelService, tokens: int, repeat: int) -> dict:
    doc = document(svc, tokens)
    first = turn_1(doc)
    answer, _, _ = await run_turn(svc, first, None, 32)
    second = [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And what is sold on market days?"},
    ]
    await run_turn(svc, second, None, 1)  # warm-up: first-call costs out of the timing
    cold, warm, cached = [], [], 0
    for i in range(repeat):
        _, t, _ = await run_turn(svc, second, None, 1)
        cold.append(t)
        sid = f"bench-{i}"
        await run_turn(svc, first, sid, 32)
        _, t, cached = await run_turn(svc, second, sid, 1)
        warm.append(t)
        svc.release_session(sid)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return {
        "turn2_prompt_tokens": len(svc.encode_chat(second)),
        "cached_tokens": cached,
        "ttft_cold_s": round(cold_s, 3),
        "ttft_warm_s": round(warm_s, 3),
        "speedup": round(cold_s / warm_s, 1),
        "warm_vs_peer": round(PEER_CACHED_TTFT_S / warm_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: the shipped SmolLM2)")
    parser.add_argument("--tokens", type=int, default=1500, help="turn-1 prompt size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path = args.model or default_model_path()
    svc = ModelService.load(ModelConfig(name="bench", path=str(path), max_sessions=4))
    try:
        result = asyncio.run(measure(svc, args.tokens, args.repeat))
    finally:
        svc.close()
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"turn 2: {result['turn2_prompt_tokens']} prompt tokens, "
        f"{result['cached_tokens']} from the session cache"
    )
    print(f"TTFT cold (no session)   {result['ttft_cold_s']:.3f} s")
    print(f"TTFT warm (session)      {result['ttft_warm_s']:.3f} s")
    print(f"speedup                  {result['speedup']:.1f}x")
    print(
        f"vs llama-server's {PEER_CACHED_TTFT_S} s cached TTFT: "
        f"{result['warm_vs_peer']:.2f}x (> 1 is faster)"
    )


if __name__ == "__main__":
    main()
