"""Decode deep in a long context with each KV cache type (the `kv_dtype` load option), in
process: one slot holding ~3,000 positions, steps of B = 1 through `forward_decode`.

    python bench/bench_kv_dtype.py [--backend cpu] [--context 3000] [--reps 3]

Prints, per type, ms per decode step (best of --reps loops of 16 steps, the types
interleaved), its ratio to f32,
the KV bytes per token and how many sessions of 4,096 tokens fit in 8 GiB of KV. The
cache is filled with random keys and values (attention's cost does not depend on them),
so no 3,000-token prefill runs. PANTHEON_THREADS sets the kernels' threads.
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
from kernels.kv_types import KV_DTYPES  # noqa: E402

STEPS = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--model", default=None, help="a GGUF (default: the shipped SmolLM2)")
    ap.add_argument("--context", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    gf = GGUFFile(args.model or default_model_path())
    model = architecture_module(gf.architecture).load(gf, backend=get_backend(args.backend))
    hp, n = model.hp, args.context
    rng = np.random.default_rng(0)
    print(f"{Path(gf.path).name} on {args.backend}, decode at {n} cached positions, B = 1")
    caches, at, best = {}, {}, {}
    for kv_dtype in KV_DTYPES:
        kv = model.make_kv_cache(1, n + STEPS * (args.reps + 1) + 1, kv_dtype)
        for layer in range(len(model.layers)):
            k = rng.standard_normal((hp.n_kv_head, n, hp.head_dim), dtype=np.float32)
            kv.write(layer, 0, 0, k, k[::-1])
        caches[kv_dtype], at[kv_dtype], best[kv_dtype] = kv, n, float("inf")
    for rep in range(args.reps + 1):  # interleaved: a noisy host slows every type alike
        for kv_dtype, kv in caches.items():
            t = time.perf_counter()
            for _ in range(STEPS):
                model.forward_decode([5], [at[kv_dtype]], [0], kv)
                at[kv_dtype] += 1
            if rep:  # the first loop warms up
                best[kv_dtype] = min(best[kv_dtype], (time.perf_counter() - t) / STEPS)
    for kv_dtype, kv in caches.items():
        sec, per_token = best[kv_dtype], kv.bytes_per_token()
        fit = (8 << 30) // (per_token * 4096)
        print(
            f"kv_dtype {kv_dtype:5s}: {sec * 1e3:6.2f} ms/step ({1 / sec:5.1f} tok/s, "
            f"{best['f32'] / sec:4.2f}x f32)  KV {per_token:6d} B/token, {fit:3d} sessions "
            "of 4k in 8 GiB"
        )


if __name__ == "__main__":
    main()
