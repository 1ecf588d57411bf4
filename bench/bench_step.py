"""The engine's own pass times, in process (no server): one decode step of B rows
(`forward_decode`, the fused stack on the compiled backend) and the prefill of several
short prompts one pass each against one packed pass (`forward_packed`), same run.

    python bench/bench_step.py [--backend cpu] [--reps 5] [--prompt-tokens 10,37]

Prints ms per decode step at B = 1 and 8 (best of --reps loops of 20 steps over 8 slots
holding 40-token prompts) and, for 6 prompts of each --prompt-tokens length, ms for six
`forward` calls and for one `forward_packed` call with their ratio (same bits: tested in
tests/engine/models/test_packed_prefill.py). PANTHEON_THREADS sets the kernels' threads.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_engine import default_model_path  # noqa: E402
from engine.loading.gguf_file import GGUFFile  # noqa: E402
from engine.models import architecture_module  # noqa: E402
from kernels import get_backend  # noqa: E402


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default=None, help="a GGUF (default: the shipped SmolLM2)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prompt-tokens", default="10,37")
    args = ap.parse_args()

    gf = GGUFFile(args.model or default_model_path())
    model = architecture_module(gf.architecture).load(gf, backend=get_backend(args.backend))
    kv = model.make_kv_cache(8, 1024)
    rng = np.random.default_rng(0)
    vocab = min(model.hp.vocab_size, 30000)
    for slot in range(8):
        model.forward(rng.integers(100, vocab, size=40), 0, kv, slot)

    print(f"{Path(gf.path).name if hasattr(gf, 'path') else ''} on {args.backend}")
    for b in (1, 8):

        def steps(b=b):
            for i in range(20):
                model.forward_decode([5] * b, [40 + i] * b, list(range(b)), kv)

        sec = best(steps, args.reps) / 20
        print(f"decode step B={b}: {sec * 1e3:6.2f} ms  ({b / sec:5.0f} tok/s)")

    if not model.packs_prefill:
        print("packed prefill: the backend does not pack (packs_prefill is False)")
        return
    for n in (int(x) for x in args.prompt_tokens.split(",")):
        prompts = [rng.integers(100, vocab, size=n).tolist() for _ in range(6)]

        def alone(prompts=prompts):
            for slot, tokens in enumerate(prompts):
                model.forward(np.asarray(tokens), 0, kv, slot)

        def packed(prompts=prompts):
            model.forward_packed([(t, 0, slot) for slot, t in enumerate(prompts)], kv)

        a, p = best(alone, args.reps), best(packed, args.reps)
        print(
            f"prefill 6 x {n} tokens: {a * 1e3:6.1f} ms one pass each, {p * 1e3:6.1f} ms packed"
            f"  (x{a / p:.2f})"
        )


if __name__ == "__main__":
    main()
