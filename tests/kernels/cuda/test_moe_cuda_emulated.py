"""The mixture-of-experts FFN on the CUDA backend, run by the CUDA emulator
(tests/kernels/cuda/cuda_emu, the fake `cupy` of test_cuda_emulated.py): routing reads the
router logits back to the host, rows are gathered and scattered with device arrays, and
the tiny qwen3moe gives what XpBackend gives on numpy, each decode row as alone."""

from __future__ import annotations

import numpy as np

from kernels.xp.backend import XpBackend
from tests.kernels.cuda.test_cuda_emulated import cp, cuda_backend, load  # noqa: F401

NAME = "tiny-qwen3moe.gguf"


def test_the_cuda_backend_runs_the_mixture_as_xp_on_numpy(cp, cuda_backend):  # noqa: F811
    ours, ref = load(NAME, cuda_backend), load(NAME, XpBackend(np))
    assert isinstance(ours.layers[0].moe.down[3].data, cp.ndarray)
    prompt = np.random.default_rng(9).integers(0, 256, size=11)
    logits = []
    for model in (ours, ref):
        kv = model.make_kv_cache(3, 32)
        logits.append(model.forward(prompt, 0, kv, 0, all_logits=True))
        logits.append(model.forward_decode([5, 9, 77], [11, 0, 0], [0, 1, 2], kv))
    np.testing.assert_allclose(logits[0], logits[2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1], logits[3], rtol=1e-4, atol=1e-4)
    # Each decode row as alone (the same positions, fresh slots).
    for b, (token, position) in enumerate([(5, 11), (9, 0), (77, 0)]):
        kv = ours.make_kv_cache(3, 32)
        ours.forward(prompt, 0, kv, 0)
        alone = ours.forward_decode([token], [position], [b], kv)[0]
        assert np.array_equal(alone, logits[1][b]), b
