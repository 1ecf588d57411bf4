"""The fused decode step (every layer in one C call, kernels/cpu/decode.c) against the
per-op path (PANTHEON_CPU_FUSED_DECODE=0) in the real server: two Daphnes on the compiled
backend, the same file, measured in turns in one run.

Figures: single-stream decode tok/s (128 tokens after the first, greedy, end tokens
banned) and the aggregate of 8 concurrent streams (64 tokens each); the ratio is fused /
per-op. Prints a table (or JSON with --json).

    python bench/bench_fused_decode.py [--reps 3] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.bench_engine import default_model_path  # noqa: E402
from tests.e2e.daphne_server import running_server  # noqa: E402

MODEL = "smollm2-135m-instruct"
# SmolLM2's end tokens (<|endoftext|>, <|im_start|>, <|im_end|>) banned: full-length runs.
NO_END = {"0": -100, "1": -100, "2": -100}


def stream_tokens(url: str, topic: str, max_tokens: int) -> tuple[int, float, float]:
    """(content chunks, time of the first, time of the last) of one streamed answer."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Write a long story about {topic}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "logit_bias": NO_END,
    }
    n, first, last = 0, 0.0, 0.0
    with httpx.Client(timeout=300) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    last = time.perf_counter()
                    first = first or last
                    n += 1
    return n, first, last


def decode_tok_s(url: str) -> float:
    n, first, last = stream_tokens(url, "dragons", 129)
    return (n - 1) / (last - first)


def aggregate8_tok_s(url: str) -> float:
    topics = ["ships", "gardens", "robots", "rivers", "castles", "bees", "comets", "owls"]
    counts = [0] * 8

    def one(i: int) -> None:
        counts[i] = stream_tokens(url, topics[i], 64)[0]

    start = time.perf_counter()
    workers = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = default_model_path()
    env = {
        "PANTHEON_BACKEND": "cpu",
        "PANTHEON_THREADS": str(args.threads),
        "PANTHEON_MAX_CONCURRENT": "8",
        "PANTHEON_MAX_SESSIONS": "8",
    }
    configs = {"fused": {}, "per-op": {"PANTHEON_CPU_FUSED_DECODE": "0"}}
    results: dict[str, dict[str, list[float]]] = {
        name: {"decode": [], "agg8": []} for name in configs
    }
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, extra in configs.items():
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            server = stack.enter_context(running_server(folder, {MODEL: path}, **env, **extra))
            urls[name] = server.url
            stream_tokens(server.url, "warm-up", 16)
        for _ in range(args.reps):
            for name, url in urls.items():  # in turns: drift hits both alike
                results[name]["decode"].append(decode_tok_s(url))
                results[name]["agg8"].append(aggregate8_tok_s(url))
    summary = {
        name: {k: round(statistics.median(v), 1) for k, v in figures.items()}
        for name, figures in results.items()
    }
    ratios = {k: round(summary["fused"][k] / summary["per-op"][k], 2) for k in ("decode", "agg8")}
    if args.json:
        print(json.dumps({"summary": summary, "ratios": ratios, "raw": results}, indent=1))
        return
    print(f"SmolLM2 Q4_1, {args.threads} threads, medians of {args.reps}")
    print(f"{'figure':<32}{'per-op':>10}{'fused':>10}{'fused/per-op':>14}")
    for key, label in (("decode", "decode tok/s, one stream"), ("agg8", "aggregate tok/s, 8")):
        row = f"{label:<32}{summary['per-op'][key]:>10}{summary['fused'][key]:>10}"
        print(row + f"{ratios[key]:>13}x")


if __name__ == "__main__":
    main()
