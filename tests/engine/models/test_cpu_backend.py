"""The compiled CPU backend runs the real models on their GGUF blocks: no float32 copy of
a quantised matrix, the numpy reference's results, batch invariance, honest fallbacks."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels import get_backend
from kernels.weights import STACK, Weight
from tests.engine.models.test_batch_invariance import check_batch_invariance
from tests.tiny_gguf import write_tiny_llama


def _load(path, backend):
    gf = GGUFFile(path)
    return gf, architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path, cpu):
    """SmolLM2 on the compiled backend and on the numpy reference."""
    gf, compiled = _load(smollm2_path, cpu)
    _, reference = _load(smollm2_path, get_backend("numpy"))
    return gf, compiled, reference


def _maps_a_file(array) -> bool:
    while array is not None:
        if isinstance(array, mmap.mmap):
            return True
        array = getattr(array, "base", None)
    return False


def _matrices(model) -> list[Weight]:
    found = [model.tok_embd, model.output]
    for layer in model.layers:
        found += [v for v in vars(layer).values() if isinstance(v, Weight)]
    return found


def test_weights_stay_in_their_file_blocks(smollm2_pair):
    gf, compiled, reference = smollm2_pair
    file_bytes = gf.path.stat().st_size
    for w in _matrices(compiled):
        parts = [p for _, p in w.meta["parts"]] if w.storage == STACK else [w]
        for part in parts:
            assert part.is_blocks and part.storage in ("Q4_1", "Q8_0"), part.storage
            assert _maps_a_file(part.data), "a copy, not a view of the file's memory map"
    assert compiled.weight_bytes < 1.05 * file_bytes
    assert reference.weight_bytes > 4 * compiled.weight_bytes  # the float32 copy it avoids
    assert compiled.fallback_types == {}


def test_prefill_and_decode_match_the_numpy_reference(smollm2_pair):
    _, compiled, reference = smollm2_pair
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 49152, size=37)
    logits = {}
    for name, model in (("cpu", compiled), ("numpy", reference)):
        kv = model.make_kv_cache(1, 64)
        pre = model.forward(prompt, 0, kv, 0, all_logits=True)  # the tiled prefill path
        steps = [
            model.forward_decode([int(t)], [37 + i], [0], kv)[0] for i, t in enumerate(prompt[:3])
        ]
        logits[name] = np.concatenate([pre, np.stack(steps)])
    ours, ref = logits["cpu"], logits["numpy"]
    np.testing.assert_allclose(ours, ref, atol=1e-2, rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).mean() > 0.95
    for row_ours, row_ref in zip(ours, ref, strict=True):
        top = np.argsort(-row_ref)[:5]
        np.testing.assert_allclose(row_ours[top], row_ref[top], atol=1e-2)


def test_short_prompt_chunks_use_the_decode_kernel_with_the_same_result(smollm2_pair):
    _, compiled, _ = smollm2_pair
    be, w = compiled.backend, compiled.layers[0].ffn_gate_up
    x = np.random.default_rng(1).standard_normal((9, w.shape[1])).astype(np.float32)
    tiled = be.linear_prefill(x, w)  # dequantised tiles through BLAS
    direct = be.linear(x, w)  # the compiled kernel
    np.testing.assert_allclose(tiled, direct, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (0, 30.0)])
def test_prefill_attention_matches_the_numpy_reference(cpu, window, softcap):
    from kernels.reference.backend import NumpyBackend

    rng = np.random.default_rng(2)
    H, Hkv, Dh, start, T = 8, 2, 64, 9, 13
    q, k, v = (rng.standard_normal((T, h, Dh)).astype(np.float32) for h in (H, Hkv, Hkv))
    cached_k, cached_v = rng.standard_normal((2, Hkv, start, Dh)).astype(np.float32)
    outs = []
    for be in (cpu, NumpyBackend()):
        kv = be.make_kv_cache(2, 3, Hkv, 32, Dh)
        kv.k[1, 2, :, :start], kv.v[1, 2, :, :start] = cached_k, cached_v
        outs.append(be.attention_prefill(q, k, v, kv, 1, 2, start, 0.125, window, softcap))
        assert kv._high_water[2] == start + T
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_smollm2_decodes_a_batch_bitwise_as_alone(smollm2_pair):
    _, compiled, _ = smollm2_pair
    check_batch_invariance(compiled, 49152, [5, 9, 3, 12, 7, 1, 10, 6])


def test_a_type_without_a_kernel_falls_back_and_says_so(tmp_path, cpu):
    path = write_tiny_llama(
        tmp_path / "q2k.gguf", matrix_type=Q.Q2_K, raw_blocks=True,
        d_model=256, n_head=4, n_kv_head=2, d_ff=512, n_layer=1,
    )  # fmt: skip
    _, compiled = _load(path, cpu)
    _, reference = _load(path, get_backend("numpy"))
    assert compiled.fallback_types.get("Q2_K", 0) >= 4  # qkv, output, gate/up, down
    assert reference.fallback_types == {}  # the reference dequantises by design
    tokens = np.array([1, 40, 41, 42, 2, 43])
    ours = compiled.forward(tokens, 0, compiled.make_kv_cache(1, 16), 0, all_logits=True)
    ref = reference.forward(tokens, 0, reference.make_kv_cache(1, 16), 0, all_logits=True)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_mixed_type_matrices_are_stacked_parts_not_copies(gemma3_path, cpu):
    _, model = _load(gemma3_path, cpu)
    qkv = model.layers[0].attn_qkv
    assert qkv.storage == STACK
    types = [part.storage for _, part in qkv.meta["parts"]]
    assert len(set(types)) > 1, types  # gemma3 Q4_K_M: v is stored in another type
    assert qkv.shape[0] == sum(part.shape[0] for _, part in qkv.meta["parts"])
