"""What a process killed while writing the weight cache leaves behind is never read back as
valid, and its staging folder (up to a whole model's float32 weights) is removed by the
next writer, unless its writer is still alive."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from engine.loading.weight_cache import WeightCache

A = np.arange(12, dtype=np.float32).reshape(3, 4)
KEY = "v1-llama-L1"


def fill(root) -> list[np.ndarray]:
    built: list[np.ndarray] = []

    def make() -> np.ndarray:
        built.append(A)
        return A

    with WeightCache(root, KEY, 1 << 30) as cache:
        np.testing.assert_array_equal(cache.get("a", make), A)
    return built


def dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def abandoned(root, pid: int):
    """A staging folder as a writer killed just before its rename leaves it: complete."""
    staging = root / f".{KEY}.{pid}.12345.tmp"
    staging.mkdir(parents=True)
    np.save(staging / "000.npy", np.zeros_like(A))
    (staging / "manifest.json").write_text('{"format": 2, "tensors": {}}')
    return staging


def test_a_killed_writers_staging_folder_is_removed_not_read(tmp_path):
    staging = abandoned(tmp_path, dead_pid())
    assert len(fill(tmp_path)) == 1  # built: the staged zeros were never taken
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY]
    assert not staging.exists()


def test_a_staging_folder_left_under_this_pid_is_removed(tmp_path):
    # A container restarts the server under the same pid: the folder is not this run's.
    staging = abandoned(tmp_path, os.getpid())
    fill(tmp_path)
    assert not staging.exists()


def test_a_live_writers_staging_folder_is_left_alone(tmp_path):
    staging = abandoned(tmp_path, os.getppid())
    fill(tmp_path)
    assert staging.is_dir()


def test_a_truncated_cache_file_is_rebuilt(tmp_path):
    fill(tmp_path)
    target = tmp_path / KEY / "000.npy"
    target.write_bytes(target.read_bytes()[:-7])  # a write cut short
    assert len(fill(tmp_path)) == 1
    assert fill(tmp_path) == []  # whole again
