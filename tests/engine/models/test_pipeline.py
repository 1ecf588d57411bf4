"""A model split by layers across dies (models/_pipeline.py), on host dies (kernels.devices.dies:
the die logic with xp = numpy): every pass runs on the dies' own engine threads, hidden
states go from stage to stage, and the result is the bits of the same model on one die;
each decode row stays bitwise as alone; sessions' KV parks and restores across stages.
On CUDA dies the same code runs with CuPy (tests/gpu, run on an H200)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kernels
from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from engine.models._pipeline import PipelineModel, load_pipeline, split_layers
from kernels.devices import dies as dies_mod
from kernels.xp.backend import XpBackend
from tests.engine.models.test_batch_invariance import TINY

MODELS = ["tiny-qwen2.gguf", "tiny-qwen3.gguf"]


def split(path, n_dies: int) -> PipelineModel:
    gf = GGUFFile(path)
    spec = architecture_module(gf.architecture).SPEC
    return load_pipeline(gf, spec, dies_mod.host_dies(n_dies), kernels.die_backend)


def whole(path):
    gf = GGUFFile(path)
    return architecture_module(gf.architecture).load(gf, backend=XpBackend(np))


def test_layers_split_evenly_in_order():
    assert split_layers(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    assert split_layers(2, 2) == [range(0, 1), range(1, 2)]
    with pytest.raises(ValueError):
        split_layers(2, 3)


@pytest.mark.parametrize("name", MODELS)
def test_a_split_model_computes_the_bits_of_the_whole_one(name):
    one, two = whole(TINY / name), split(TINY / name, 2)
    assert [len(s.model.layers) for s in two.stages] == [
        len(r) for r in split_layers(one.hp.n_layer, 2)
    ]
    assert two.stages[0].model.tok_embd is not None and two.stages[0].model.output is None
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 200, size=13)
    kv1, kv2 = one.make_kv_cache(2, 32), two.make_kv_cache(2, 32)
    assert kv2.layout == kv1.k.shape[:1] + kv1.k.shape[2:3] + kv1.k.shape[4:]
    assert kv2.nbytes == kv1.nbytes
    a = one.forward(prompt, 0, kv1, 1, all_logits=True)
    b = two.forward(prompt, 0, kv2, 1, all_logits=True)
    assert isinstance(b, np.ndarray) and np.array_equal(a, b)
    # Decode rows, one sequence and two.
    a = one.forward_decode([7, 9], [13, 0], [1, 0], kv1)
    b = two.forward_decode([7, 9], [13, 0], [1, 0], kv2)
    assert np.array_equal(a, b)
    # Saved KV is every layer, in order, whichever die held it.
    k1, v1 = kv1.save(1, 14)
    k2, v2 = kv2.save(1, 14)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    np.testing.assert_array_equal(
        one.hidden_states(prompt[:4], 0, one.make_kv_cache(1, 8), 0),
        two.hidden_states(prompt[:4], 0, two.make_kv_cache(1, 8), 0),
    )


def test_each_stage_runs_on_its_dies_thread():
    model = split(TINY / "tiny-qwen3.gguf", 2)
    seen = []
    for stage in model.stages:
        original = stage.model.decode_rows

        def spy(*args, original=original, **kwargs):
            seen.append(threading.current_thread().name)
            return original(*args, **kwargs)

        stage.model.decode_rows = spy
    kv = model.make_kv_cache(1, 8)
    model.forward_decode([3], [0], [0], kv)
    assert seen == ["die-host:0", "die-host:1"]


def test_decode_rows_are_bitwise_as_alone_across_dies():
    model = split(TINY / "tiny-qwen3.gguf", 2)
    lengths = [3, 5, 9, 2, 12, 7, 4, 6]
    kv = model.make_kv_cache(8, 16)
    rng = np.random.default_rng(3)
    for slot, n in enumerate(lengths):
        model.forward(rng.integers(0, 256, size=n), 0, kv, slot)
    tokens = [int(t) for t in rng.integers(0, 256, size=8)]
    saved = [kv.save(s, 16) for s in range(8)]

    def reset():
        for s, (k, v) in enumerate(saved):
            kv.load(s, k, v, 16)

    alone = []
    for b in range(8):
        reset()
        alone.append(model.forward_decode([tokens[b]], [lengths[b]], [b], kv)[0])
    for B in (1, 3, 8):
        reset()
        batched = model.forward_decode(tokens[:B], lengths[:B], list(range(B)), kv)
        for b in range(B):
            assert np.array_equal(batched[b], alone[b]), (B, b)


def test_a_failing_stage_raises_in_the_caller_and_the_die_keeps_serving():
    model = split(TINY / "tiny-qwen3.gguf", 2)
    kv = model.make_kv_cache(1, 4)
    with pytest.raises(ValueError, match="exceed"):
        model.forward(np.arange(6), 0, kv, 0)
    assert model.forward(np.arange(3), 0, kv, 0).shape == (model.hp.vocab_size,)


def test_smollm2_split_across_three_dies_computes_the_whole_models_bits(smollm2_path):
    one, three = whole(smollm2_path), split(smollm2_path, 3)
    assert [len(s.model.layers) for s in three.stages] == [10, 10, 10]
    # Tied embeddings: the first stage embeds with the table, the last computes logits.
    assert three.stages[-1].model.output is three.stages[-1].model.tok_embd is not None
    prompt = [1, 9690, 198, 2683, 359]
    a = one.forward(prompt, 0, one.make_kv_cache(1, 8), 0)
    b = three.forward(prompt, 0, three.make_kv_cache(1, 8), 0)
    assert np.array_equal(a, b)
