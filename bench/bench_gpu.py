"""The GPU backend's figures beside their rooflines, measured in the same run (issue 16).

    python bench/bench_gpu.py [--backend cuda|xp] [--layers 30] [--steps 16] [--json OUT]

The shipped SmolLM2 does not travel to the GPU machine (the device tool carries 64 MiB),
so this writes a file of SmolLM2's shape there (30 layers, d 576, 9 / 3 heads, ffn 1536,
49152 tokens, random Q4_1 blocks: the same bytes per token) and loads it on die 0 as the
server does (`dies: [0]`: models/_pipeline.py on kernels.devices.dies), with `--backend cuda` the
CUDA kernels (kernels/cuda/backend.py), with `--backend xp` the array code alone
(XpBackend on CuPy: the before-kernels baseline):

- decode tok/s at 1, 8, 32 and 64 streams (one token per stream per step, logits kept on
  the device and the greedy token chosen there: only token ids come back), with CUDA
  graphs and without, each beside the bandwidth roofline (device-to-device copy GB/s
  measured here, over the weight bytes one step reads);
- the launch floor: one kernel launch's latency measured here, times our kernels'
  launches per decode step (counted), beside one replayed step at 1 stream;
- prefill tok/s on a 2048-token prompt.

Targets on one H200 (issue 16): single stream >= 1,000 tok/s with graphs, 64 streams >=
20,000 tok/s aggregate, 2k-token prefill under 50 ms. `--backend xp --xp numpy` runs the
script's own logic on the CPU (with --layers 2 --steps 2 --prompt 64 for a quick check).
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


def decode_rate(model, xp, streams: int, steps: int) -> float:
    kv = model.make_kv_cache(streams, 64 + steps)
    rng = np.random.default_rng(streams)
    for slot in range(streams):
        model.forward(rng.integers(3, 259, size=16), 0, kv, slot)
    tokens = [int(t) for t in rng.integers(3, 259, size=streams)]
    slots = list(range(streams))
    # Warm-up as timed: compiles (CuPy's argmax too, per shape: a first run on an H200 timed
    # its compile inside the 8-stream figure), fills pools; with graphs, runs direct, then
    # captures, then replays once.
    for warm in range(3):
        logits = model.forward_decode(tokens, [16 + warm] * streams, slots, kv, True)
        to_host(xp, xp.argmax(logits, axis=1))
    t = time.perf_counter()
    for step in range(steps):
        logits = model.forward_decode(tokens, [19 + step] * streams, slots, kv, True)
        tokens = [int(i) for i in to_host(xp, xp.argmax(logits, axis=1))]  # synced
    return streams * steps / (time.perf_counter() - t)


def to_host(xp, a) -> np.ndarray:
    return a if xp is np else xp.asnumpy(a)


def prefill_seconds(model, n: int) -> float:
    kv = model.make_kv_cache(1, n + 1)
    prompt = np.random.default_rng(0).integers(3, 259, size=n)
    best = float("inf")
    for _ in range(3):  # the first compiles and sizes pools at this length: best of three
        t = time.perf_counter()
        model.forward(prompt, 0, kv, 0)
        best = min(best, time.perf_counter() - t)
    return best


def launch_floor(model, xp) -> dict:
    """One launch's latency (a one-element kernel, 2000 times, synced once) and how many
    of our kernels a one-stream decode step launches (counted through the launchers)."""
    if xp is np:
        return {}
    from kernels.cuda import kernels as cuda_kernels

    one = xp.zeros(1, dtype=xp.float32)
    one += 1  # compiled
    synchronize(xp)
    t = time.perf_counter()
    for _ in range(2000):
        one += 1
    synchronize(xp)
    latency = (time.perf_counter() - t) / 2000
    launched = []
    original = cuda_kernels._kernel

    def counting(name):
        kernel = original(name)

        def launch(*args):
            launched.append(name)
            return kernel(*args)

        return launch

    kv = model.make_kv_cache(1, 32)
    model.forward([5, 6, 7], 0, kv, 0)
    graphs, model.graphs = model.graphs, None  # direct: every kernel launched from Python
    cuda_kernels._kernel = counting
    try:
        model.forward_decode([8], [3], [0], kv, keep_on_device=True)
    finally:
        cuda_kernels._kernel = original
        model.graphs = graphs
    return {
        "launch_latency_us": latency * 1e6,
        "our_launches_per_step": len(launched),
        "floor_direct_tok_s": 1 / (latency * len(launched)) if launched else None,
    }


def load(path: Path, backend: str, xp):
    """The file on die 0 as a `dies: [0]` load puts it (one stage on the die's thread)."""
    from engine.loading.gguf_file import GGUFFile
    from engine.models import architecture_module
    from engine.models._pipeline import load_pipeline
    from kernels import die_backend
    from kernels.devices import dies
    from kernels.xp.backend import XpBackend

    gf = GGUFFile(path)
    spec = architecture_module(gf.architecture).SPEC
    if backend == "cuda":
        on = dies.DieManager(dies.probe_cuda()).get([0])
        return load_pipeline(gf, spec, on, die_backend)
    return load_pipeline(gf, spec, dies.host_dies(1), lambda die: XpBackend(xp))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["cuda", "xp"], default="cuda")
    ap.add_argument("--xp", choices=["cupy", "numpy"], default="cupy")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per figure")
    ap.add_argument("--prompt", type=int, default=PROMPT)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    xp = array_module("cupy" if args.backend == "cuda" else args.xp)

    with tempfile.TemporaryDirectory() as tmp:
        path = write_model(Path(tmp) / "smollm2-shaped.gguf", args.layers)
        model = load(path, args.backend, xp)
        weight_bytes = model.weight_bytes  # on the device: about the file's size
        bandwidth = copy_bandwidth(xp, 1 << 30 if xp is not np else 1 << 24)
        result = {
            "backend": args.backend,
            "layers": args.layers,
            "weight_bytes": int(weight_bytes),
            "copy_GBps": bandwidth / 1e9,
            "decode": {},
        }
        print(
            f"{args.backend}: {args.layers} layers, {weight_bytes / 1e6:.1f} MB of weights, "
            f"copy {bandwidth / 1e9:.0f} GB/s"
        )
        print(f"{'figure':<36}{'measured':>14}{'roofline':>14}{'ratio':>8}")
        modes = [("graphs", model.graphs), ("direct", None)] if model.graphs else [("direct", None)]
        for streams in STREAMS:
            for mode, graphs in modes:
                model.graphs = graphs
                rate = decode_rate(model, xp, streams, args.steps)
                roof = streams * bandwidth / 2 / weight_bytes  # one read of the weights a step
                result["decode"][f"{streams}-{mode}"] = {"tok_s": rate, "roofline_tok_s": roof}
                label = f"decode, {streams} stream(s), {mode}"
                print(f"{label:<36}{rate:>10.1f} t/s{roof:>10.0f} t/s{rate / roof:>8.3f}")
        model.graphs = modes[0][1]
        if model.graphs is not None:
            result["graphs"] = model.graphs_report(operator=True)
            print("graphs:", json.dumps(result["graphs"]))
        floor = launch_floor(model, xp)
        if floor:
            result["launch"] = floor
            print(
                f"launch latency {floor['launch_latency_us']:.1f} us x "
                f"{floor['our_launches_per_step']} of our kernels a step: direct floor "
                f"{floor['floor_direct_tok_s'] or 0:.0f} t/s at 1 stream"
            )
        seconds = prefill_seconds(model, args.prompt)
        result["prefill"] = {"tokens": args.prompt, "seconds": seconds}
        print(
            f"{f'prefill, {args.prompt} tokens':<36}{seconds * 1e3:>11.1f} ms"
            f"{args.prompt / seconds:>10.0f} t/s"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
