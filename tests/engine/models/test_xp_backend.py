"""The GPU backend's logic (kernels/xp/backend.py) run with xp = numpy: the tiny qwen2 /
qwen3 models against their float32 references, SmolLM2's first greedy steps against its
reference, each decode row bitwise as alone (B = 1..8), weights kept as their file's
blocks, and the device KV cache's save / load round trip. On a GPU the same lines run
with xp = CuPy (issue 16; not yet run there)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.xp.backend import XpBackend, XpKVCache
from tests.engine.models.test_architectures import as_list, check_tiny_reference, greedy
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance


def load(path):
    gf = GGUFFile(path)
    return gf, architecture_module(gf.architecture).load(gf, backend=XpBackend(np))


@pytest.fixture(scope="module", params=["tiny-qwen2.gguf", "tiny-qwen3.gguf"])
def tiny(request):
    return request.param, load(TINY / request.param)


def test_tiny_models_match_their_float32_references(tiny, tiny_f32):
    name, (_, model) = tiny
    assert isinstance(model.backend, XpBackend)
    check_tiny_reference(model, next(m for m in tiny_f32["models"] if m["gguf"] == name))


def test_each_decode_row_is_bitwise_as_alone(tiny):
    _, (_, model) = tiny
    assert isinstance(model.make_kv_cache(1, 4), XpKVCache)
    check_batch_invariance(model, 256, [3, 5, 9, 2, 12, 7, 4, 6])


def test_weights_stay_in_their_file_blocks(tiny):
    name, (gf, model) = tiny
    layer = model.layers[0]
    qkv = layer.attn_qkv.meta["parts"]
    # tiny-qwen2 keeps F16 matrices, tiny-qwen3 Q8_0: uploaded as the file's bytes.
    expected = {"tiny-qwen2.gguf": "F16", "tiny-qwen3.gguf": "Q8_0"}[name]
    assert {part.storage for _, part in qkv} == {expected}
    assert all(part.data.dtype == np.uint8 for _, part in qkv)
    tensor = next(t for t in gf.reader.tensors if t.name == "blk.0.attn_q.weight")
    assert qkv[0][1].data.nbytes == tensor.n_bytes


def test_smollm2_first_steps_match_the_float32_reference(smollm2_path, smollm2_f32):
    _, model = load(smollm2_path)
    case = smollm2_f32["greedy"][0]
    steps = 4  # every step dequantises all 135M weights in numpy: ~1.3 s each
    got, seen = greedy(model, as_list(case["prompt_ids"]), steps)
    assert got == as_list(case["greedy_ids"])[:steps]
    for step, ref in enumerate(as_list(case["steps"])[:steps]):
        np.testing.assert_allclose(seen[step][ref["top_ids"]], ref["top_logits"], atol=1e-2)


def test_the_device_kv_cache_saves_and_loads_a_slot():
    kv = XpKVCache(np, 2, 3, 2, 16, 4)
    rng = np.random.default_rng(0)
    k, v = (
        rng.standard_normal((2, 2, 5, 4), dtype=np.float32),
        rng.standard_normal((2, 2, 5, 4), dtype=np.float32),
    )
    kv.load(1, k, v, 5)
    saved_k, saved_v = kv.save(1, 5)
    assert np.array_equal(saved_k, k) and np.array_equal(saved_v, v)
    assert not np.shares_memory(saved_k, kv.k)
    kv.copy_prefix(1, 2, 3)
    assert np.array_equal(kv.view(1, 2, 3)[0], k[1, :, :3])
    assert kv.layout == (2, 2, 4) and kv.bytes_per_token() == 2 * 2 * 2 * 4 * 4
    assert kv.release(1) == 0  # device memory is held whole: nothing to hand back
