#!/usr/bin/env python3
"""llama.cpp's logits on tests/reference/tiny/tiny-qwen3moe.gguf: the second, independent
reference for the qwen3moe file (the first is scripts/reference_moe.py's float32
transformers run).

    LLAMA_CPP_LIB_PATH=DIR PYTHONPATH=LLAMA_CPP_PYTHON_SRC \\
        python scripts/reference_moe_llamacpp.py [--out tests/reference/tiny]

Needs llama-cpp-python's `llama_cpp` package (its ctypes bindings) and the libllama built
from the llama.cpp it vendors (../shared/tools/llama-server builds that tree: its
build/bin holds libllama.so and the ggml libraries); not part of the project, not run by
the tests. For each prompt of the float32 reference it records, at temperature 0 with
one thread: per-position argmax, max logit and top-1/top-2 margin over the prompt, the
last position's top-5 logits, and 24 greedy steps with their margins. llama.cpp
quantises the activations inside its Q8_0 products (to Q8_1), so it agrees with the
float32 reference to about 0.1 here, not 1e-5: the behaviour of the most used peer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N_GREEDY = 24


def top2_margin(row: np.ndarray) -> float:
    a, b = np.sort(row)[-2:][::-1]
    return round(float(a - b), 5)


def run_case(model, prompt: list[int]) -> dict:
    model.reset()
    model.eval(prompt)
    logits = np.array(model.scores[: len(prompt)], dtype=np.float64)
    last = logits[-1]
    top5 = np.argsort(-last)[:5]
    greedy, margins, step = [], [], last
    for _ in range(N_GREEDY):
        token = int(np.argmax(step))
        greedy.append(token)
        margins.append(top2_margin(step))
        model.eval([token])
        step = np.array(model.scores[model.n_tokens - 1], dtype=np.float64)
    return {
        "prompt_ids": prompt,
        "last_logits_top5_ids": [int(i) for i in top5],
        "last_logits_top5": [round(float(last[i]), 5) for i in top5],
        "per_position_argmax": [int(i) for i in logits.argmax(-1)],
        "per_position_max_logit": [round(float(v), 5) for v in logits.max(-1)],
        "per_position_margin": [top2_margin(row) for row in logits],
        "greedy_ids": greedy,
        "top1_top2_margin": margins,
    }


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "reference" / "tiny")
    args = ap.parse_args()
    f32 = json.loads((args.out / "tiny_moe_f32.json").read_text("utf-8"))["models"][0]
    path = args.out / f32["gguf"]
    model = llama_cpp.Llama(
        str(path), logits_all=True, n_ctx=128, n_batch=64, n_threads=1, verbose=False
    )
    entry = {
        "gguf": f32["gguf"],
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "reference": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), CPU, one thread",
        "cases": [run_case(model, case["prompt_ids"]) for case in f32["cases"]],
    }
    out = args.out / "tiny_moe_llamacpp.json"
    out.write_text(json.dumps({"models": [entry]}, indent=1) + "\n", "utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
