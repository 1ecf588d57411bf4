"""The GPU backend's logic with xp = CuPy against the same code with xp = numpy: block
dequantisation for every type, the tiny qwen2 / qwen3 models (logits and greedy text),
each decode row as alone on the device (within 1e-4: cuBLAS), and weights resident as
the file's bytes.

Run on an H200 with tests/gpu/run-on-device.sh."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels.xp import quants as xp_quants
from kernels.xp.backend import XpBackend
from tests.engine.models.test_batch_invariance import TINY, check_batch_invariance
from tests.tiny_gguf import random_blocks

TYPES = sorted(xp_quants.DEQUANTIZERS, key=lambda q: q.name)
K_QUANTS = {Q.Q4_K, Q.Q5_K, Q.Q6_K}
TINY_MODELS = ["tiny-qwen2.gguf", "tiny-qwen3.gguf"]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantisation_on_the_device_is_ggufs(cp, qtype):
    cols = 512 if qtype in K_QUANTS else 96
    if qtype == Q.F32:
        values = np.random.default_rng(1).standard_normal((9, cols)).astype(np.float32)
        blocks = values.view(np.uint8).reshape(9, -1)
        ref = values
    else:
        blocks = random_blocks(f"gpu-{qtype.name}", (9, cols), qtype)
        ref = quants.dequantize(blocks, qtype).astype(np.float32).reshape(9, cols)
    ours = cp.asnumpy(xp_quants.dequantize(cp, cp.asarray(blocks), qtype))
    # Bitwise where the device rounds each operation; a fused multiply-add (d * q + m in
    # one rounding) may move the last bit, never more.
    np.testing.assert_allclose(ours, ref, rtol=2**-22, atol=0)


def load(cp_or_np, name):
    gf = GGUFFile(TINY / name)
    return architecture_module(gf.architecture).load(gf, backend=XpBackend(cp_or_np))


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_models_compute_on_the_device_what_they_compute_on_numpy(cp, name):
    on_gpu, on_cpu = load(cp, name), load(np, name)
    prompt = np.random.default_rng(2).integers(0, 256, size=23)
    logits = {}
    for key, model in (("gpu", on_gpu), ("cpu", on_cpu)):
        kv = model.make_kv_cache(1, 64)
        logits[key] = model.forward(prompt, 0, kv, 0, all_logits=True)
        assert isinstance(logits[key], np.ndarray)  # only logits come back
    np.testing.assert_allclose(logits["gpu"], logits["cpu"], rtol=1e-4, atol=1e-4)
    assert (logits["gpu"].argmax(-1) == logits["cpu"].argmax(-1)).mean() > 0.95


@pytest.mark.parametrize("name", TINY_MODELS)
def test_each_decode_row_is_as_alone_on_the_device(cp, name):
    """Within 1e-4 (as the logits against numpy above), not bitwise: XpBackend's row
    products are one (B, 1, K) x (K, N) matmul, which CuPy hands to cuBLAS as a (B, K)
    GEMM whose kernel (and summation order) depends on B (seen on an H200: last-bit
    differences from B = 2). XpBackend on CuPy is
    the kernels' twin and bench_gpu's baseline, never served: a CUDA die computes with
    CudaBackend, whose rows are bitwise as alone (test_cuda_kernels.py)."""
    model = load(cp, name)
    assert isinstance(model.make_kv_cache(1, 4).k, cp.ndarray)
    check_batch_invariance(model, 256, [3, 5, 9, 2, 12, 7, 4, 6], rtol=1e-4)


def test_weights_live_on_the_device_as_the_files_bytes(cp):
    gf = GGUFFile(TINY / "tiny-qwen3.gguf")
    model = architecture_module(gf.architecture).load(gf, backend=XpBackend(cp))
    part = model.layers[0].attn_qkv.meta["parts"][0][1]
    assert isinstance(part.data, cp.ndarray) and part.data.dtype == np.uint8
    tensor = next(t for t in gf.reader.tensors if t.name == "blk.0.attn_q.weight")
    assert part.data.nbytes == tensor.n_bytes
