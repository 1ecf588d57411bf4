"""greedy_logits (kernels/cpu/greedy.c): a greedy row's argmax without its whole product.

Every id that could be a row's largest allowed logit holds linear's own float32 value,
bit for bit; everything else is -inf; so the argmax (ties to the lower id) is linear's.
Checked at every ISA this CPU runs (the VNNI screen where it has AVX-512 VNNI, the
portable one elsewhere), on random matrices with near ties, exact ties and bans, on rows
the screen cannot decide, and on the shipped model's own output matrix and hidden states.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType

from tests.kernels.cpu.test_cpu_kernels import _cpu  # skips where it is not built

Q8_0 = int(GGMLQuantizationType.Q8_0)


@pytest.fixture(params=_cpu.supported_isas())
def isa(request):
    before = _cpu.isa()
    _cpu.set_isa(request.param)
    yield request.param
    _cpu.set_isa(before)


def q8_matrix(n: int, k: int, rng: np.random.Generator, ties: int = 0) -> np.ndarray:
    values = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    for i in range(ties):  # rows that equal an earlier one: exact ties in every product
        values[n - 1 - i] = values[i]
    return quants.quantize(values, GGMLQuantizationType.Q8_0)


def prep(w: np.ndarray, k: int):
    norms = np.empty(w.shape[0], dtype=np.float32)
    sums = np.empty((w.shape[0], k // 32), dtype=np.int16)
    _cpu.greedy_prep(w, norms, sums)
    return norms, sums


def run(w, norms, sums, x, bans=None):
    B = x.shape[0]
    bans = bans or [()] * B
    off = np.zeros(B + 1, dtype=np.int64)
    off[1:] = np.cumsum([len(b) for b in bans])
    ids = np.array([i for b in bans for i in b], dtype=np.int64)
    out = np.full((B, w.shape[0]), np.nan, dtype=np.float32)
    computed = np.zeros(B, dtype=np.int64)
    _cpu.greedy_logits(w, norms, sums, x, off, ids, out, computed)
    return out, computed


def full(w, x):
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    _cpu.linear(Q8_0, w, x, out)
    return out


def assert_keeps_the_argmax(out, ref, bans=None):
    for b in range(ref.shape[0]):
        allowed = ref[b].copy()
        allowed[[i for i in (bans or {}).get(b, ()) if i < len(allowed)]] = -np.inf
        kept = np.isfinite(out[b])
        assert np.array_equal(out[b][kept], ref[b][kept]), b  # linear's own bits
        assert np.all(out[b][~kept] == -np.inf)
        assert int(np.argmax(out[b])) == int(np.argmax(allowed)), b
        # every id tied with the largest allowed value is kept (a tie goes to the lower)
        top = np.flatnonzero(allowed == allowed.max())
        assert kept[top].all(), b


def test_the_norms_bound_each_row_and_the_sums_are_its_quants():
    rng = np.random.default_rng(0)
    w = q8_matrix(300, 128, rng)
    norms, sums = prep(w, 128)
    blocks = w.reshape(300, 4, 34)
    q = blocks[:, :, 2:].view(np.int8).astype(np.int64)
    assert np.array_equal(sums, q.sum(axis=2))
    exact = np.linalg.norm(
        quants.dequantize(w, GGMLQuantizationType.Q8_0).astype(np.float64), axis=1
    )
    assert np.all(norms >= exact) and np.all(norms <= exact * (1 + 1e-6))


@pytest.mark.parametrize("B", [1, 3, 8, 11])
def test_every_row_keeps_linears_argmax_and_its_values(isa, B):
    rng = np.random.default_rng(B)
    w = q8_matrix(5000, 256, rng, ties=40)
    norms, sums = prep(w, 256)
    for trial in range(4):
        x = rng.standard_normal((B, 256)).astype(np.float32) * (0.5 + trial)
        if trial == 3:  # the winner's own direction: a clear top, near ties below it
            x[:] = quants.dequantize(w[17:18], GGMLQuantizationType.Q8_0)[0] * 40
        out, computed = run(w, norms, sums, x)
        ref = full(w, x)
        assert_keeps_the_argmax(out, ref)
        assert np.all(computed >= 1) and np.all(computed < 5000)  # screened, not whole


def test_near_ties_closer_than_the_screens_rounding_keep_the_float32_order(isa):
    """Copies of one row with a quant moved by one step at two places: their products
    differ by less than int8 x can tell apart, so the screen's order among them is
    often wrong; the bound keeps them all and float32 decides."""
    rng = np.random.default_rng(7)
    w = q8_matrix(4000, 128, rng)
    base = w[0].copy()
    for r in range(1, 200):
        row = base.copy()
        k, k2 = rng.choice(128, 2, replace=False)
        for pos, step in ((k, 1), (k2, -1)):
            b, i = divmod(int(pos), 32)
            q = row[b * 34 + 2 + i].view(np.int8)
            row[b * 34 + 2 + i] = np.int8(np.clip(int(q) + step, -127, 127)).view(np.uint8)
        w[r] = row
    norms, sums = prep(w, 128)
    x = quants.dequantize(w[:1], GGMLQuantizationType.Q8_0) * 25
    x = (x + rng.standard_normal((8, 128)) * 0.3).astype(np.float32)
    out, computed = run(w, norms, sums, x)
    assert_keeps_the_argmax(out, full(w, x))
    assert np.all(computed > 1)  # the near ties really were undecided by the screen


def test_exact_ties_keep_every_tied_id_and_the_lower_wins(isa):
    rng = np.random.default_rng(3)
    w = q8_matrix(2000, 128, rng, ties=5)  # rows 1995..1999 equal rows 4..0
    norms, sums = prep(w, 128)
    x = np.repeat(quants.dequantize(w[2:3], GGMLQuantizationType.Q8_0) * 30, 4, axis=0)
    out, _ = run(w, norms, sums, x.astype(np.float32))
    assert np.isfinite(out[:, 2]).all() and np.isfinite(out[:, 1997]).all()
    assert (np.argmax(out, axis=1) == 2).all()
    assert_keeps_the_argmax(out, full(w, x.astype(np.float32)))


def test_banned_ids_are_never_kept_and_the_next_best_wins(isa):
    rng = np.random.default_rng(4)
    w = q8_matrix(3000, 128, rng)
    norms, sums = prep(w, 128)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    ref = full(w, x)
    top = np.argsort(-ref, axis=1)
    bans = [
        (int(top[b, 0]),) if b % 2 == 0 else (int(top[b, 0]), int(top[b, 1]), 99999)
        for b in range(6)
    ]
    out, _ = run(w, norms, sums, x, bans)
    for b in range(6):
        assert np.all(out[b, [i for i in bans[b] if i < 3000]] == -np.inf)
    assert_keeps_the_argmax(out, ref, dict(enumerate(bans)))


def test_rows_the_screen_cannot_decide_come_back_whole(isa):
    rng = np.random.default_rng(5)
    w = q8_matrix(1000, 64, rng)
    norms, sums = prep(w, 64)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1, 3] = np.inf  # a non-finite row: its product says what that means
    x[2, 5] = np.nan
    bans = [(), (), (), tuple(range(1000))]  # every id banned: the sampler says what then
    out, computed = run(w, norms, sums, x, bans)
    ref = full(w, x)
    for b in (1, 2, 3):
        assert computed[b] == 1000
        np.testing.assert_array_equal(out[b], ref[b])  # NaN where linear has NaN
    assert_keeps_the_argmax(out[:1], ref[:1])


def test_bfloat16_activations_get_linears_whole_product():
    if "bfloat16" not in _cpu.supported_activations():
        pytest.skip("no AVX-512 BF16 here")
    rng = np.random.default_rng(6)
    w = q8_matrix(512, 64, rng)
    norms, sums = prep(w, 64)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    _cpu.set_activations("bfloat16")
    try:
        out, _ = run(w, norms, sums, x)
        ref = full(w, x)
    finally:
        _cpu.set_activations("float32")
    np.testing.assert_array_equal(out, ref)


def test_the_shipped_models_rows_need_few_float32_products(smollm2_path):
    """On SmolLM2's output matrix and hidden states of its own greedy text the bound is
    tight: a handful of ids per row, never the whole row."""
    from engine.loading.gguf_file import GGUFFile
    from engine.models import llama

    model = llama.load(GGUFFile(str(smollm2_path)))
    kv = model.make_kv_cache(1, 64)
    tokens = [1, 9690, 198, 19161, 253, 1789, 2526, 563, 253, 17604, 30]
    tokens.append(int(np.argmax(model.forward(np.array(tokens), 0, kv, 0))))
    for _ in range(20):  # greedy text, so the states are the ones serving meets
        logits = model.forward_decode([tokens[-1]], [len(tokens) - 1], [0], kv)
        tokens.append(int(np.argmax(logits[0])))
    h = model.hidden_states(np.array(tokens), 0, model.make_kv_cache(1, 64), 0)
    w = model.output.data
    norms, sums = prep(w, model.output.shape[1])
    x = np.ascontiguousarray(h[-24:], dtype=np.float32)
    out, computed = run(w, norms, sums, x)
    assert_keeps_the_argmax(out, full(w, x))
    assert np.median(computed) <= 16 and computed.max() < 1000, computed
