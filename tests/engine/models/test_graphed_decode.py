"""A model's decode step through CUDA-graph slots (kernels/devices/graphs.py and the replay buffers
of kernels/cuda/graphs.py), with xp = numpy: the graph itself is CuPy's, but the static
input buffers, the padding of a step up to its bucket onto the KV cache's scratch slot,
the slot states and the report are the same code. Every step gives the bits the direct
step gives, and the real slots' KV is unchanged by the padding rows."""

from __future__ import annotations

import numpy as np

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from engine.models._pipeline import load_pipeline
from kernels.devices import dies
from kernels.xp.backend import XpBackend
from tests.engine.models.test_batch_invariance import TINY


class GraphedXp(XpBackend):
    """XpBackend on numpy that takes the graph path (no graph: the replay buffers only)."""

    captures_graphs = True


def split(captures: bool):
    gf = GGUFFile(TINY / "tiny-qwen3.gguf")
    spec = architecture_module(gf.architecture).SPEC
    backend = GraphedXp if captures else XpBackend
    return load_pipeline(gf, spec, dies.host_dies(2), lambda die: backend(np))


def test_graphed_steps_give_the_direct_steps_bits():
    graphed, direct = split(True), split(False)
    assert direct.graphs is None and graphed.graphs is not None
    kvs = [m.make_kv_cache(6, 32) for m in (graphed, direct)]
    assert [kv.scratch_slot for _, kv in kvs[0].parts] == [6, 6]  # one spare slot per part
    rng = np.random.default_rng(7)
    lengths = [5, 9, 3, 12, 7, 4]
    for slot, n in enumerate(lengths):
        prompt = rng.integers(0, 256, size=n)
        for model, kv in zip((graphed, direct), kvs, strict=True):
            model.forward(prompt, 0, kv, slot)
    assert graphed.graphs_report() is None  # no decode step yet: omitted

    positions = list(lengths)
    for rows in ([0], [1, 2, 3], [0], [4, 5, 1], [2], [0, 1, 2, 3, 4]):
        tokens = [int(t) for t in rng.integers(0, 256, size=len(rows))]
        pos = [positions[r] for r in rows]
        a = graphed.forward_decode(tokens, pos, rows, kvs[0])
        b = direct.forward_decode(tokens, pos, rows, kvs[1])
        assert a.shape == b.shape and np.array_equal(a, b), rows
        for r in rows:
            positions[r] += 1
    for slot in range(6):  # padding rows wrote only to the scratch slot
        for x, y in zip(kvs[0].save(slot, 32), kvs[1].save(slot, 32), strict=True):
            assert np.array_equal(x, y), slot

    # Buckets 1 and 4 were exercised three and twice (live), 8 once (pending), per stage.
    assert graphed.graphs_report() == {
        "live": 4,
        "total": 6,
        "failed": 0,
        "ineligible": 0,
        "pending": 2,
    }
    operator = graphed.graphs_report(operator=True)
    assert (operator["captures"], operator["capture_failures"], operator["gave_up"]) == (4, 0, 0)
    assert operator["segment"]["total"] == 6


def test_a_second_kv_cache_gets_graphs_of_its_own():
    """A captured step reads and writes the KV cache it was captured on: a step on another
    cache of the same model (a bench's, a second service's) must not replay that graph."""
    graphed, direct = split(True), split(False)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 256, size=n) for n in (6, 9)]
    caches = []
    for prompt in prompts:
        pair = [m.make_kv_cache(1, 32) for m in (graphed, direct)]
        for model, kv in zip((graphed, direct), pair, strict=True):
            model.forward(prompt, 0, kv, 0)
        caches.append(pair)
    for (kv_graphed, kv_direct), prompt in zip(caches, prompts, strict=True):
        for step in range(3):  # direct, capture, replay: each cache's own
            tokens, pos = [int(rng.integers(0, 256))], [len(prompt) + step]
            a = graphed.forward_decode(tokens, pos, [0], kv_graphed)
            b = direct.forward_decode(tokens, pos, [0], kv_direct)
            assert np.array_equal(a, b), step
    assert graphed.graphs_report(operator=True)["captures"] == 4  # 2 caches x 2 stages

    graphed.release(caches[0][0])  # that cache's graphs go with it
    assert graphed.graphs_report()["total"] == 2
