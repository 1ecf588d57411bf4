#!/usr/bin/env python3
"""llama.cpp's logits on the tiny GGUFs: the second, independent reference for each file
of a float32 transformers reference (the first: scripts/reference_moe.py's
tiny_moe_f32.json, scripts/reference_dense.py's tiny_dense_f32.json,
scripts/reference_gptoss.py's tiny_gptoss_f32.json).

    LLAMA_CPP_LIB_PATH=DIR PYTHONPATH=LLAMA_CPP_PYTHON_SRC \\
        python scripts/reference_llamacpp.py {moe,dense,gptoss} [--out tests/reference/tiny]

reads tiny_<set>_f32.json and writes tiny_<set>_llamacpp.json. Needs llama-cpp-python's
`llama_cpp` package (its ctypes bindings; it imports `diskcache`) and the libllama built
from the llama.cpp it vendors (../shared/tools/llama-server builds that tree: its
build/bin holds libllama.so and the ggml libraries); not part of the project, not run by
the tests. For each prompt of the float32 reference it records, at temperature 0 with
one thread: per-position argmax, max logit and top-1/top-2 margin over the prompt, the
last position's top-5 logits, and 24 greedy steps with their margins, twice:
`cases`, the file as stored with llama.cpp's defaults (an F16 KV cache; the activations
of each Q8_0 product rounded to 8 bits, so 0.1-1.5 off the float32 logits: the
behaviour of the most used peer), and `f32_weights_cases`, a scratch copy with every
tensor dequantised to F32 and an F32 KV cache (nothing rounded: the same function as
the float32 reference to about 1e-4).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N_GREEDY = 24
F32 = 0  # ggml_type GGML_TYPE_F32, for the KV cache


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


def f32_copy(path: Path, out: Path) -> Path:
    """The file with every tensor dequantised to F32: llama.cpp then rounds nothing."""
    import gguf

    source = gguf.GGUFReader(str(path))
    arch = str(source.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(out), arch)
    for field in source.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer's own
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    for t in source.tensors:
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, value.reshape([int(n) for n in reversed(t.shape)]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def cases_of(llama_cpp, path: Path, prompts: list[list[int]], **kv_cache) -> list[dict]:
    model = llama_cpp.Llama(
        str(path), logits_all=True, n_ctx=128, n_batch=64, n_threads=1, verbose=False, **kv_cache
    )
    return [run_case(model, prompt) for prompt in prompts]


def reference_of(llama_cpp, path: Path, prompts: list[list[int]]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        unrounded = f32_copy(path, Path(tmp) / path.name)
        f32_cases = cases_of(llama_cpp, unrounded, prompts, type_k=F32, type_v=F32)
    return {
        "gguf": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "reference": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), CPU, one thread",
        "cases": cases_of(llama_cpp, path, prompts),
        "f32_weights_cases": f32_cases,
    }


def main() -> None:
    import llama_cpp

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("set", choices=["moe", "dense", "gptoss"], help="which tiny_<set>_f32.json")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "reference" / "tiny")
    args = ap.parse_args()
    f32 = json.loads((args.out / f"tiny_{args.set}_f32.json").read_text("utf-8"))
    models = [
        reference_of(llama_cpp, args.out / m["gguf"], [c["prompt_ids"] for c in m["cases"]])
        for m in f32["models"]
    ]
    out = args.out / f"tiny_{args.set}_llamacpp.json"
    out.write_text(json.dumps({"models": models}, indent=1) + "\n", "utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
