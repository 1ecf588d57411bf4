"""Every architecture decodes B rows in one pass, each row bitwise as alone (B = 1..8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module

TINY = Path(__file__).resolve().parents[2] / "reference" / "tiny"


def _load(path: Path):
    if not path.is_file():
        pytest.skip(f"{path.name} is not in this checkout")
    gf = GGUFFile(path)
    return architecture_module(gf.architecture).load(gf)


@pytest.fixture(scope="module", params=["tiny-qwen2.gguf", "tiny-qwen3.gguf", "gemma3"])
def model(request):
    if request.param == "gemma3":
        return _load(request.getfixturevalue("gemma3_path"))
    return _load(TINY / request.param)


def check_batch_invariance(model, vocab: int, lengths: list[int], rtol: float = 0.0) -> None:
    """Prefill eight slots to different lengths, then decode B = 1..8 of them together
    and compare each row with the same row decoded alone: bitwise, or within `rtol` for a
    backend that does not promise bits (XpBackend on CuPy: tests/gpu)."""
    kv = model.make_kv_cache(8, max(lengths) + 4)
    rng = np.random.default_rng(3)
    for slot, n in enumerate(lengths):
        model.forward(rng.integers(0, vocab, size=n), 0, kv, slot)
    tokens = [int(t) for t in rng.integers(0, vocab, size=8)]
    saved = kv.k.copy(), kv.v.copy()
    alone = []
    for b in range(8):
        kv.k[...], kv.v[...] = saved
        alone.append(model.forward_decode([tokens[b]], [lengths[b]], [b], kv)[0])
    for B in range(1, 9):
        kv.k[...], kv.v[...] = saved
        batched = model.forward_decode(tokens[:B], lengths[:B], list(range(B)), kv)
        for b in range(B):
            assert same(batched[b], alone[b], rtol), (B, b)
    # Order in the batch does not matter either.
    order = [5, 2, 7, 0]
    kv.k[...], kv.v[...] = saved
    mixed = model.forward_decode([tokens[b] for b in order], [lengths[b] for b in order], order, kv)
    for j, b in enumerate(order):
        assert same(mixed[j], alone[b], rtol), b
    # And the decode row is the prefill-style forward of that one token.
    kv.k[...], kv.v[...] = saved
    one = model.forward(np.array([tokens[0]]), lengths[0], kv, 0)
    np.testing.assert_allclose(one, alone[0], rtol=1e-5, atol=1e-4)


def test_each_architecture_decodes_a_batch_bitwise_as_alone(model):
    # Gemma3's sliding window is 512: slot lengths past it exercise the windowed layers.
    long = model.hp.sliding_window and model.hp.sliding_window + 8
    lengths = [3, 5, 9, 2, 12, 7, 4, long or 6]
    check_batch_invariance(model, min(model.hp.vocab_size, 256), lengths)


def same(got, want, rtol: float) -> bool:
    if rtol == 0.0:
        return np.array_equal(got, want)
    return np.allclose(got, want, rtol=rtol, atol=rtol)
