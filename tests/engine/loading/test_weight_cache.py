from __future__ import annotations

import json

import numpy as np
import pytest

from engine.loading.weight_cache import WeightCache

A = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.ones(5, dtype=np.float32)


def fill(root, key="v1-llama-L1", max_bytes=1 << 30):
    built = []

    def build(array):
        def make():
            built.append(array)
            return array

        return make

    with WeightCache(root, key, max_bytes) as cache:
        a = cache.get("a", build(A))
        b = cache.get("b", build(B))
    return cache, built, a, b


def test_the_first_load_builds_and_the_second_maps_the_cache(tmp_path):
    first, built, _, _ = fill(tmp_path)
    assert len(built) == 2 and not first.used
    second, built, a, b = fill(tmp_path)
    assert built == [] and second.used
    assert isinstance(a, np.memmap)
    np.testing.assert_array_equal(a, A)
    np.testing.assert_array_equal(b, B)


def test_a_corrupted_file_is_rebuilt_not_trusted(tmp_path):
    fill(tmp_path)
    folder = tmp_path / "v1-llama-L1"
    manifest = json.loads((folder / "manifest.json").read_text())
    target = folder / manifest["tensors"]["a"]["file"]
    raw = bytearray(target.read_bytes())
    raw[-1] ^= 0xFF  # flip bits in the data, not the header
    target.write_bytes(bytes(raw))
    cache, built, a, _ = fill(tmp_path)
    assert [x is A for x in built] == [True] and not cache.used
    np.testing.assert_array_equal(a, A)
    # ... and the rebuilt cache is whole again.
    cache, built, _, _ = fill(tmp_path)
    assert built == [] and cache.used


def test_a_manifest_from_another_format_is_ignored(tmp_path):
    fill(tmp_path)
    path = tmp_path / "v1-llama-L1" / "manifest.json"
    path.write_text(json.dumps({"format": 999, "tensors": {}}))
    _, built, _, _ = fill(tmp_path)
    assert len(built) == 2


def test_a_failed_build_publishes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with WeightCache(tmp_path, "k", 1 << 30) as cache:
            cache.get("a", lambda: A)
            raise RuntimeError("load failed half-way")
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_least_recently_used_folder_is_evicted_over_the_cap(tmp_path):
    fill(tmp_path, key="old")
    fill(tmp_path, key="new", max_bytes=10)  # far below two folders' size
    assert [p.name for p in tmp_path.iterdir()] == ["new"]


def test_json_documents_are_cached_and_checked(tmp_path):
    doc = {"metadata": {"general.architecture": "llama"}, "tensors": {"t": [0, [2, 3]]}}
    with WeightCache(tmp_path, "k", 1 << 30) as cache:
        assert cache.get_json("header", lambda: doc) == doc
    with WeightCache(tmp_path, "k", 1 << 30) as cache:
        assert cache.get_json("header", lambda: pytest.fail("rebuilt")) == doc
        assert cache.used
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    (tmp_path / "k" / manifest["documents"]["header"]["file"]).write_text('{"tampered": 1}')
    with WeightCache(tmp_path, "k", 1 << 30) as cache:
        assert cache.get_json("header", lambda: doc) == doc
        assert not cache.used
