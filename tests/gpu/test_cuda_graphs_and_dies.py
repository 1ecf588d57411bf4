"""A model placed on CUDA dies (kernels.devices.dies: each stage on its die's engine thread, its own
stream) and its decode steps through CUDA graphs (kernels/cuda/graphs.py): replayed steps
give the direct steps' bits, padding rows touch only the scratch slot, every capture
succeeds, and the `graphs` / `attention` reports say so; /admin/dies' numbers from the
device. Run on an H200 (tests/gpu/run-on-device.sh)."""

from __future__ import annotations

import numpy as np
import pytest

import kernels
from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from engine.models._pipeline import load_pipeline
from kernels.devices import dies
from tests.engine.models.test_batch_invariance import TINY


@pytest.fixture(scope="module")
def cuda_dies(cp):
    found = dies.DieManager(dies.probe_cuda())
    assert found.kind == "cuda" and len(found) >= 1
    with dies.use_manager(found):
        yield found


def pipeline(on: list, graphs: bool):
    gf = GGUFFile(TINY / "tiny-qwen3.gguf")
    model = load_pipeline(gf, architecture_module(gf.architecture).SPEC, on, kernels.die_backend)
    if not graphs:
        model.graphs = None
    return model


def test_the_probed_dies_report_their_memory(cuda_dies):
    row = cuda_dies.listing()["data"][0]
    assert row["vram_budget"] == cuda_dies.dies[0].total_bytes - dies.reserve_bytes() > 0
    assert kernels.backend_name() == "cuda" and kernels.dies_visible() == len(cuda_dies)


def test_graphed_decode_gives_the_direct_bits_on_the_device(cuda_dies):
    on = cuda_dies.dies[:1]
    graphed, direct = pipeline(on, True), pipeline(on, False)
    assert graphed.graphs is not None
    kvs = [m.make_kv_cache(5, 64) for m in (graphed, direct)]
    rng = np.random.default_rng(4)
    lengths = [7, 12, 3, 30, 9]
    for slot, n in enumerate(lengths):
        prompt = rng.integers(0, 256, size=n)
        for model, kv in zip((graphed, direct), kvs, strict=True):
            model.forward(prompt, 0, kv, slot)
    positions = list(lengths)
    for rows in ([0], [0], [1, 2, 3], [4, 0, 1], [2], [0, 1, 2, 3, 4], [3, 1, 4, 0, 2]):
        tokens = [int(t) for t in rng.integers(0, 256, size=len(rows))]
        pos = [positions[r] for r in rows]
        a = graphed.forward_decode(tokens, pos, rows, kvs[0])
        b = direct.forward_decode(tokens, pos, rows, kvs[1])
        assert np.array_equal(a, b), rows
        for r in rows:
            positions[r] += 1
    for slot in range(5):
        for x, y in zip(kvs[0].save(slot, 64), kvs[1].save(slot, 64), strict=True):
            assert np.array_equal(x, y), slot
    report = graphed.graphs_report(operator=True)
    assert report["capture_failures"] == 0, graphed.graphs.slots
    assert report["live"] >= 2 and report["captures"] == report["live"]


def test_a_model_split_across_two_dies_on_the_device(cuda_dies):
    if len(cuda_dies) < 2:
        pytest.skip("one CUDA device: the split runs on host dies in the suite")
    gf = GGUFFile(TINY / "tiny-qwen3.gguf")
    spec = architecture_module(gf.architecture).SPEC
    one = load_pipeline(gf, spec, cuda_dies.dies[:1], kernels.die_backend)
    two = load_pipeline(gf, spec, cuda_dies.dies[:2], kernels.die_backend)
    prompt = np.arange(11) % 200
    a = one.forward(prompt, 0, one.make_kv_cache(1, 32), 0, all_logits=True)
    b = two.forward(prompt, 0, two.make_kv_cache(1, 32), 0, all_logits=True)
    assert np.array_equal(a, b)  # the same kernels on either die: the same bits
