"""Packed prefill: prompt chunks of several sequences in one pass give each chunk the bits
its own pass gives (logits and the KV it writes), on the real models, and the runner packs
the step's chunks only where the backend allows it."""

from __future__ import annotations

import numpy as np
import pytest

from engine.loading.gguf_file import GGUFFile
from engine.models import architecture_module
from kernels import get_backend


def _load(path, backend):
    gf = GGUFFile(path)
    return architecture_module(gf.architecture).load(gf, backend=backend)


@pytest.fixture(scope="module")
def smollm2(smollm2_path, cpu):
    return _load(smollm2_path, cpu)


def _chunks(rng, vocab):
    """(tokens, start, slot): a fresh prompt, one resumed at 40 on a slot already holding
    40 positions, a long one, and one just over the row-kernel limit."""
    sizes = [(37, 0, 1), (23, 40, 2), (130, 0, 3), (5, 0, 5)]
    return [(rng.integers(5, vocab, size=n).tolist(), start, slot) for n, start, slot in sizes]


def _fill(model, kv, rng, vocab):
    model.forward(rng.integers(5, vocab, size=40), 0, kv, 2)


def _assert_packed_is_alone(model, n_ctx=256):
    vocab = min(model.hp.vocab_size, 30000)
    alone_kv, packed_kv = model.make_kv_cache(6, n_ctx), model.make_kv_cache(6, n_ctx)
    _fill(model, alone_kv, np.random.default_rng(1), vocab)
    _fill(model, packed_kv, np.random.default_rng(1), vocab)
    chunks = _chunks(np.random.default_rng(2), vocab)

    alone = [model.forward(np.asarray(t), s, alone_kv, slot) for t, s, slot in chunks]
    packed = model.forward_packed(chunks, packed_kv)

    assert len(packed) == len(chunks)
    for a, p in zip(alone, packed, strict=True):
        assert p.shape == a.shape
        np.testing.assert_array_equal(p, a)  # bitwise
    np.testing.assert_array_equal(packed_kv.k, alone_kv.k)
    np.testing.assert_array_equal(packed_kv.v, alone_kv.v)


def test_packed_chunks_are_each_chunk_alone_bitwise_smollm2(smollm2):
    assert smollm2.packs_prefill
    _assert_packed_is_alone(smollm2)


def test_packed_chunks_are_each_chunk_alone_bitwise_gemma3(gemma3_path, cpu):
    # sliding-window layers, a second RoPE table, q/k norms, sandwich norms, softcap-free
    # attention and an embedding scale: every part of the shared block
    gemma3 = _load(gemma3_path, cpu)
    _assert_packed_is_alone(gemma3, n_ctx=640)


def test_short_chunks_are_not_packed(smollm2):
    # alone, a chunk of <= prefill_direct_rows tokens takes the row kernel: packing it would
    # change its bits, so the model refuses it
    assert not smollm2.packable(smollm2.backend.prefill_direct_rows)
    assert smollm2.packable(smollm2.backend.prefill_direct_rows + 1)
    kv = smollm2.make_kv_cache(2, 64)
    with pytest.raises(ValueError, match="cannot be packed"):
        smollm2.forward_packed([([1, 2, 3], 0, 0), (list(range(5, 15)), 0, 1)], kv)


def test_the_numpy_reference_does_not_pack(smollm2_path):
    # its prefill product is one BLAS GEMM, whose bits may depend on the rows beside them
    model = _load(smollm2_path, get_backend("numpy"))
    assert not model.packs_prefill
    assert not model.packable(100)


def test_the_runner_packs_a_steps_chunks_and_samples_what_alone_gives(smollm2):
    from engine.decoding.sampler import Sampler
    from engine.decoding.state import DecodeState
    from engine.serving.batch import Batch, PrefillChunk
    from engine.serving.runner import Runner
    from engine.types import SamplingParams

    rng = np.random.default_rng(3)
    prompts = [rng.integers(5, 30000, size=n).tolist() for n in (33, 12, 3, 60)]

    def step(prompts_here, seq0):
        kv = smollm2.make_kv_cache(6, 128)
        runner = Runner(smollm2, kv)
        calls = []
        real = smollm2.forward_packed

        def spy(chunks, kv_):
            calls.append(len(chunks))
            return real(chunks, kv_)

        smollm2.forward_packed = spy
        try:
            chunks = tuple(
                PrefillChunk(
                    seq_id=seq0 + i,
                    slot=i,
                    start=0,
                    token_ids=p,
                    copy_to_slots=(),
                    sample_seq_ids=(seq0 + i,),
                )
                for i, p in enumerate(prompts_here)
            )
            states = {  # sampled at temperature 1: every logit counts, not only the top one
                seq0 + i: DecodeState(Sampler(SamplingParams(temperature=1.0, seed=7 + seq0 + i)))
                for i in range(len(prompts_here))
            }
            sampled = runner.run(Batch(prefill=chunks, decode=(), started=()), states)
        finally:
            del smollm2.forward_packed
        return sampled, calls, runner.last.prefill_tokens

    together, calls, tokens = step(prompts, 0)
    assert calls == [3]  # the 3-token chunk runs alone (row kernel)
    assert tokens == sum(map(len, prompts))
    alone = {}
    for i, p in enumerate(prompts):
        got, calls, _ = step([p], i)  # seq i: slot 0, seed 7 + i as above
        assert calls == []
        alone[i] = got[i]
    assert together == alone
