"""The GPU backend's figures beside their rooflines, measured in the same run (issue 16).

    python bench/bench_gpu.py [--xp cupy|numpy] [--layers 30] [--steps 16] [--json OUT]

The shipped SmolLM2 does not travel to the GPU machine (the device tool carries 64 MiB),
so this writes a file of SmolLM2's shape there (30 layers, d 576, 9 / 3 heads, ffn 1536,
49152 tokens, random Q4_1 blocks: the same bytes per token) and runs it on
`kernels.xp_backend.XpBackend(xp)`:

- decode tok/s at 1, 8, 32 and 64 streams (one token per stream per step, logits back to
  the host each step), each beside the bandwidth roofline: device-to-device copy GB/s
  measured here, over the weight bytes one step reads;
- prefill tok/s on a 2048-token prompt.

Today's XpBackend dequantises every weight chunk on every step (array code, no CUDA C
yet), so these are the before-kernels baseline the issue's targets (single stream >= 1,000
tok/s, 64 streams >= 20,000, 2k prefill < 50 ms) will be measured against. `--xp numpy`
runs the same on the CPU (use --layers 2 for a quick check of the script itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SMOLLM2_SHAPE = {"d_model": 576, "n_head": 9, "n_kv_head": 3, "d_ff": 1536, "n_vocab": 49152}
STREAMS = (1, 8, 32, 64)
PROMPT = 2048


def array_module(name: str):
    if name == "numpy":
        return np
    import cupy

    return cupy


def synchronize(xp) -> None:
    if xp is not np:
        xp.cuda.Device().synchronize()


def copy_bandwidth(xp, n_bytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes per second a device-to-device copy moves (read + write), best of reps."""
    src = xp.ones(n_bytes // 4, dtype=xp.float32)
    dst = xp.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        synchronize(xp)
        t = time.perf_counter()
        dst[...] = src
        synchronize(xp)
        best = min(best, time.perf_counter() - t)
    return 2 * n_bytes / best


def write_model(path: Path, layers: int) -> Path:
    from tests.tiny_gguf import write_tiny_llama

    return write_tiny_llama(
        path,
        n_layer=layers,
        context_length=4096,
        matrix_type=GGMLQuantizationType.Q4_1,
        raw_blocks=True,
        **SMOLLM2_SHAPE,
    )


def decode_rate(model, streams: int, steps: int) -> float:
    kv = model.make_kv_cache(streams, 64 + steps)
    rng = np.random.default_rng(streams)
    for slot in range(streams):
        model.forward(rng.integers(3, 259, size=16), 0, kv, slot)
    tokens = [int(t) for t in rng.integers(3, 259, size=streams)]
    slots = list(range(streams))
    model.forward_decode(tokens, [16] * streams, slots, kv)  # warm-up (compiles, pools)
    t = time.perf_counter()
    for step in range(steps):
        model.forward_decode(tokens, [17 + step] * streams, slots, kv)  # logits: synced
    return streams * steps / (time.perf_counter() - t)


def prefill_seconds(model, n: int) -> float:
    kv = model.make_kv_cache(1, n + 1)
    prompt = np.random.default_rng(0).integers(3, 259, size=n)
    model.forward(prompt[:16], 0, model.make_kv_cache(1, 17), 0)  # warm-up
    t = time.perf_counter()
    model.forward(prompt, 0, kv, 0)
    return time.perf_counter() - t


def main() -> int:
    from inference.engine.loading.gguf_file import GGUFFile
    from inference.engine.models import architecture_module
    from kernels.xp_backend import XpBackend

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--xp", choices=["cupy", "numpy"], default="cupy")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per figure")
    ap.add_argument("--prompt", type=int, default=PROMPT)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    xp = array_module(args.xp)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_model(Path(tmp) / "smollm2-shaped.gguf", args.layers)
        gf = GGUFFile(path)
        model = architecture_module(gf.architecture).load(gf, backend=XpBackend(xp))
        weight_bytes = model.weight_bytes  # on the device: about the file's size
        bandwidth = copy_bandwidth(xp)
        result = {
            "xp": args.xp,
            "layers": args.layers,
            "weight_bytes": int(weight_bytes),
            "copy_GBps": bandwidth / 1e9,
            "decode": {},
        }
        print(
            f"{args.xp}: {args.layers} layers, {weight_bytes / 1e6:.1f} MB of weights, "
            f"copy {bandwidth / 1e9:.0f} GB/s"
        )
        print(f"{'figure':<28}{'measured':>14}{'roofline':>14}{'ratio':>8}")
        for streams in STREAMS:
            rate = decode_rate(model, streams, args.steps)
            roof = streams * bandwidth / 2 / weight_bytes  # one read of the weights a step
            result["decode"][streams] = {"tok_s": rate, "roofline_tok_s": roof}
            print(
                f"{f'decode, {streams} stream(s)':<28}{rate:>10.1f} t/s{roof:>10.0f} t/s"
                f"{rate / roof:>8.3f}"
            )
        seconds = prefill_seconds(model, args.prompt)
        result["prefill"] = {"tokens": args.prompt, "seconds": seconds}
        print(
            f"{f'prefill, {args.prompt} tokens':<28}{seconds * 1e3:>11.1f} ms"
            f"{args.prompt / seconds:>10.0f} t/s"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
