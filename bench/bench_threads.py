"""Request latency with OpenBLAS's default threads against the engine's chosen count
(kernels/devices/threads.py, PANTHEON_THREADS), with and without a busy neighbour core.

The neighbour is a busy-loop process pinned to the last usable core, as another tenant's
job would be. Each phase runs `--requests` greedy chat requests one after another on one
ModelService (SmolLM2) and reports the median and worst latency; the ratio that matters is
default / chosen under the neighbour (issue 18: 0.52 s alone, 3.9-6.2 s beside a busy core
with the default threads, 1.3 s with one). Then the acceptance run, with the chosen
threads and the neighbour: 8 clients x 20 requests on 4 slots (the default queue and its
30 s timeout) must see no 429 (ServerBusy).

    python bench/bench_threads.py [--requests 8] [--max-tokens 24] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from threadpoolctl import threadpool_limits  # noqa: E402

from bench.bench_engine import default_model_path  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import (  # noqa: E402
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    ServerBusy,
)
from kernels.devices import threads  # noqa: E402

QUESTION = "Explain in two sentences why the sky is blue, for a curious child."
CLIENTS, PER_CLIENT, SLOTS = 8, 20, 4


class Neighbour:
    """A busy-loop process pinned to one core (the last usable one)."""

    def __init__(self):
        core = max(os.sched_getaffinity(0))
        code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
        self.core = core
        self.proc = subprocess.Popen([sys.executable, "-c", code])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


async def one(svc: ModelService, prompt, max_tokens: int, tag: str) -> float:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    async for _ in svc.generate(GenerationRequest(tag, tuple(prompt), params)):
        pass
    return time.perf_counter() - t0


def sequential(svc, prompt, n: int, max_tokens: int) -> dict:
    async def run():
        return [await one(svc, prompt, max_tokens, f"seq-{i}") for i in range(n)]

    times = asyncio.run(run())
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}


def clients(svc, prompt, max_tokens: int) -> dict:
    """CLIENTS clients, each sending PER_CLIENT requests one after another."""
    busy, times = 0, []

    async def client(c: int):
        nonlocal busy
        for i in range(PER_CLIENT):
            try:
                times.append(await one(svc, prompt, max_tokens, f"c{c}-{i}"))
            except ServerBusy:
                busy += 1

    async def run():
        await asyncio.gather(*(client(c) for c in range(CLIENTS)))

    t0 = time.perf_counter()
    asyncio.run(run())
    ordered = sorted(times)
    return {
        "requests": CLIENTS * PER_CLIENT,
        "server_busy_429": busy,
        "p50_s": round(ordered[len(ordered) // 2], 3),
        "p95_s": round(ordered[int(len(ordered) * 0.95) - 1], 3),
        "max_s": round(ordered[-1], 3),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8, help="sequential requests per phase")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=0, help="the chosen count (0: default)")
    ap.add_argument("--skip-clients", action="store_true", help="no 8 x 20 acceptance run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    default_n = threads.usable_cores()  # what OpenBLAS starts with (one per core)
    chosen_n = args.threads or threads.default_threads()
    config = ModelConfig(name="bench", path=default_model_path(), max_concurrent=SLOTS)
    svc = ModelService.load(config)
    prompt = svc.encode_chat([{"role": "user", "content": QUESTION}])
    sequential(svc, prompt, 2, args.max_tokens)  # warm-up: page in weights and KV

    phases = {}
    for label, n in (("default", default_n), ("chosen", chosen_n)):
        with threadpool_limits(limits=n, user_api="blas"):
            phases[f"{label}_alone"] = sequential(svc, prompt, args.requests, args.max_tokens)
            neighbour = Neighbour()
            try:
                time.sleep(0.5)
                phases[f"{label}_neighbour"] = sequential(
                    svc, prompt, args.requests, args.max_tokens
                )
            finally:
                neighbour.stop()
    result = {
        "cores": threads.usable_cores(),
        "default_threads": default_n,
        "chosen_threads": chosen_n,
        "prompt_tokens": len(prompt),
        "max_tokens": args.max_tokens,
        "phases": phases,
        "neighbour_ratio_default_to_chosen": round(
            phases["default_neighbour"]["median_s"] / phases["chosen_neighbour"]["median_s"], 2
        ),
    }
    if not args.skip_clients:
        threads.configure(chosen_n)
        neighbour = Neighbour()
        try:
            time.sleep(0.5)
            result["clients_8x20_on_4_slots_with_neighbour"] = clients(svc, prompt, args.max_tokens)
        finally:
            neighbour.stop()
    svc.close()
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['cores']} usable cores; default {default_n} BLAS threads, chosen {chosen_n};"
        f" {len(prompt)} prompt tokens, {args.max_tokens} greedy tokens per request"
    )
    print("phase                 median s   max s")
    for name, p in phases.items():
        print(f"{name:20s}  {p['median_s']:8.3f}  {p['max_s']:6.3f}")
    print(
        "busy neighbour: default / chosen median latency = "
        f"{result['neighbour_ratio_default_to_chosen']:.2f}x"
    )
    run = result.get("clients_8x20_on_4_slots_with_neighbour")
    if run:
        verdict = "PASS" if run["server_busy_429"] == 0 else "FAIL"
        print(
            f"{CLIENTS} clients x {PER_CLIENT} requests on {SLOTS} slots with a busy neighbour "
            f"core: {run['server_busy_429']} x 429 ({verdict}); p50 {run['p50_s']} s, "
            f"p95 {run['p95_s']} s, max {run['max_s']} s, wall {run['wall_s']} s"
        )


if __name__ == "__main__":
    main()
