"""Every matrix type `gguf.quants` can write loads and computes (tiny llama GGUFs).

For each type: the dequantised weights are close to the float weights they were made
from, and the forward pass equals that of an F32 file holding exactly the dequantised
values — so the engine computes the same function whatever the storage type.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from tests.tiny_gguf import random_blocks, write_tiny_llama

# Types the library can quantise, with the worst absolute error expected for N(0, 0.2²)
# weights.
WRITABLE = {
    Q.F16: 2e-3,
    Q.BF16: 5e-3,
    Q.Q8_0: 1e-2,
    Q.Q5_1: 4e-2,
    Q.Q5_0: 5e-2,
    Q.Q4_1: 8e-2,
    Q.Q4_0: 1e-1,
    Q.MXFP4: 3e-1,
    Q.TQ2_0: 1.0,
    Q.TQ1_0: 1.0,
}
SHAPE = dict(d_model=256, n_head=4, n_kv_head=2, d_ff=512, n_layer=1)


def load(path):
    gf = GGUFFile(path)
    return gf, architecture_module(gf.architecture).load(gf)


@pytest.mark.parametrize("qtype", list(WRITABLE), ids=lambda t: t.name)
def test_a_quantised_model_computes_what_its_dequantised_weights_say(tmp_path, qtype):
    quantised = write_tiny_llama(tmp_path / "q.gguf", matrix_type=qtype, **SHAPE)
    gf, model = load(quantised)
    assert gf.tensor_type("blk.0.attn_q.weight") == qtype

    float_path = write_tiny_llama(tmp_path / "f.gguf", **SHAPE)  # same seed: same floats
    float_gf, _ = load(float_path)
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        err = np.abs(gf.load_f32(name) - float_gf.load_f32(name)).max()
        assert err <= WRITABLE[qtype], f"{name}: max error {err}"

    # The F32 twin holds exactly the dequantised values.
    def roundtrip(a, name):
        return dequantize(quantize(a, qtype), qtype).astype(np.float32).reshape(a.shape)

    _, twin = load(write_tiny_llama(tmp_path / "t.gguf", matrix_transform=roundtrip, **SHAPE))
    tokens = np.array([1, 40, 41, 42, 2, 43])
    ours = model.forward(tokens, 0, model.make_kv_cache(1, 16), 0, all_logits=True)
    ref = twin.forward(tokens, 0, twin.make_kv_cache(1, 16), 0, all_logits=True)
    assert np.isfinite(ours).all()
    # Not bitwise: a type without a compiled kernel is one fused float32 matrix, the F32
    # twin's q/k/v are the file's three maps, so BLAS sums in other blockings.
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-4)


# Types the library can read but not write: random valid blocks instead of quantised
# weights (the real gemma3 Q4_K_M file covers Q4_K and Q6_K with real data).
READ_ONLY = [
    Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS,
    Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ4_NL, Q.IQ4_XS, Q.NVFP4,
]  # fmt: skip


@pytest.mark.parametrize("qtype", READ_ONLY, ids=lambda t: t.name)
def test_a_dequantise_only_type_computes_what_its_blocks_say(tmp_path, qtype):
    _, model = load(
        write_tiny_llama(tmp_path / "q.gguf", matrix_type=qtype, raw_blocks=True, **SHAPE)
    )

    def blocks_as_floats(a, name):
        return dequantize(random_blocks(name, a.shape, qtype), qtype).astype(np.float32)

    _, twin = load(
        write_tiny_llama(tmp_path / "t.gguf", matrix_transform=blocks_as_floats, **SHAPE)
    )
    tokens = np.array([1, 40, 41, 42, 2, 43])
    ours = model.forward(tokens, 0, model.make_kv_cache(1, 16), 0, all_logits=True)
    ref = twin.forward(tokens, 0, twin.make_kv_cache(1, 16), 0, all_logits=True)
    assert np.isfinite(ours).all()
    # Not bitwise, as above (one fused float32 matrix against the twin's three maps), and
    # random blocks make logits in the thousands: float32 rounding scales with them.
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 + 1e-6 * np.abs(ref).max())
