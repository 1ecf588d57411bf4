"""The opt-in bfloat16 decode product (PANTHEON_ACTIVATIONS=bfloat16, kernels/cpu/
linear_simd.h BF16DOT): x and the decoded weights rounded to bfloat16, products summed in
float32. Each type against a numpy oracle of the same rounding; a row's bits never depend
on the batch, its neighbours or the thread count. The shipped model's text in this mode:
tests/engine/models/test_bf16_golden.py.

Runs where the CPU has AVX-512 BF16 (Zen 4, Sapphire Rapids and later); elsewhere the mode
must refuse, and the backend stays float32 and says so (tested on every CPU)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.kernels.cpu.test_cpu_kernels import K_QUANTS, QTYPES, _cpu, ks_for, make_weights, oracle

HAS_BF16 = "bfloat16" in _cpu.supported_activations()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no AVX-512 BF16")


@pytest.fixture
def bf16():
    """bfloat16 products for the test, float32 again after it. Set as the server sets it
    (configure_activations): a backend built during the test keeps it."""
    from kernels.cpu.backend import configure_activations

    assert configure_activations("bfloat16") == "bfloat16"
    try:
        yield
    finally:
        configure_activations("float32")


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32, round to nearest even (as vcvtne2ps2bf16)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def bf16_product(name: str, w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The oracle (float64 sums of bfloat16 products; the K % 32 tail of a float row in
    float32, as the kernel keeps it) and a bound on |kernel - oracle|."""
    wf = oracle(name, w).astype(np.float32)
    k = wf.shape[1]
    body = k - k % 32
    wb, xb = to_bf16(wf[:, :body]).astype(np.float64), to_bf16(x[:, :body]).astype(np.float64)
    ref = xb @ wb.T + x[:, body:].astype(np.float64) @ wf[:, body:].astype(np.float64).T
    # Our decoders fuse d * q + m into one FMA (gguf rounds twice): a weight can land on the
    # other side of a bfloat16 rounding boundary, one bfloat16 step (2^-8 relative) off.
    mags = np.abs(x).astype(np.float64) @ np.abs(wf).astype(np.float64).T
    return ref, 2.0**-8 * mags + 1e-6 * mags + 1e-30


def test_the_mode_is_float32_by_default_and_refuses_unknown_names():
    assert _cpu.activations() == "float32"
    assert _cpu.supported_activations()[0] == "float32"
    with pytest.raises(ValueError, match="unknown activations"):
        _cpu.set_activations("int8")
    assert _cpu.activations() == "float32"


class _NoBf16Kernels:
    """The extension's activation calls as a CPU without AVX-512 BF16 answers them."""

    def set_activations(self, name):
        if name != "float32":
            raise ValueError("bfloat16 activations need a CPU with AVX-512 BF16")

    def activations(self):
        return "float32"


def test_a_cpu_without_bf16_stays_float32_and_says_so(caplog):
    from kernels.cpu.backend import set_activations

    # The backend's side: asked for bfloat16 where the kernels refuse it, it warns and
    # goes on in float32 (GET / then reports float32).
    engine_log = logging.getLogger("pantheon.engine")
    engine_log.addHandler(caplog.handler)  # the project's logger does not propagate
    try:
        assert set_activations(_NoBf16Kernels(), "bfloat16") == "float32"
    finally:
        engine_log.removeHandler(caplog.handler)
    assert "PANTHEON_ACTIVATIONS=bfloat16 not used" in caplog.text
    with pytest.raises(ValueError, match="use float32 or bfloat16"):
        set_activations(_cpu, "fp8")
    # The kernels' side, on this CPU.
    if not HAS_BF16:
        with pytest.raises(ValueError, match="AVX-512 BF16"):
            _cpu.set_activations("bfloat16")
        assert _cpu.activations() == "float32"
        return
    # The mode is the AVX-512 kernels'; with a lower ISA in use it is not in effect.
    before = _cpu.isa()
    _cpu.set_activations("bfloat16")
    try:
        _cpu.set_isa("avx2")
        assert _cpu.activations() == "float32"
        _cpu.set_isa(before)
        assert _cpu.activations() == "bfloat16"
        assert set_activations(_cpu, "float32") == "float32"
    finally:
        _cpu.set_isa(before)
        _cpu.set_activations("float32")


@needs_bf16
@pytest.mark.parametrize("name", sorted(QTYPES))
def test_linear_is_the_bfloat16_product(bf16, name):
    rng = np.random.default_rng(7)
    for k in ks_for(name):
        for n in (1, 5, 17):
            w = make_weights(name, n, k, rng)
            x = rng.standard_normal((9, k)).astype(np.float32)
            out = np.full((9, n), np.nan, dtype=np.float32)
            _cpu.linear(QTYPES[name], w, x, out)
            ref, bound = bf16_product(name, w, x)
            assert np.all(np.abs(out - ref) <= bound), (name, n, k, np.abs(out - ref).max())
    # ... and it is that product, not the float32 one: on a wide row the two differ.
    k = 768 if name in K_QUANTS else 576
    w = make_weights(name, 8, k, rng)
    x = rng.standard_normal((4, k)).astype(np.float32)
    bf_out = np.empty((4, 8), dtype=np.float32)
    _cpu.linear(QTYPES[name], w, x, bf_out)
    _cpu.set_activations("float32")
    f32_out = np.empty_like(bf_out)
    _cpu.linear(QTYPES[name], w, x, f32_out)
    assert not np.array_equal(bf_out, f32_out), name


@needs_bf16
@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "F32"])
def test_a_row_has_the_same_bits_in_any_batch_and_thread_count(bf16, name):
    rng = np.random.default_rng(8)
    k = ks_for(name)[-1] if name != "F32" else 45
    w = make_weights(name, 37, k, rng)
    x = rng.standard_normal((8, k)).astype(np.float32)
    alone = np.empty((8, 37), dtype=np.float32)
    for b in range(8):
        _cpu.linear(QTYPES[name], w, x[b : b + 1], alone[b : b + 1])
    before = _cpu.get_threads()
    try:
        for threads in (1, 2, 3):
            _cpu.set_threads(threads)
            for B in range(1, 9):
                out = np.empty((B, 37), dtype=np.float32)
                _cpu.linear(QTYPES[name], w, x[:B], out)
                assert np.array_equal(out.view(np.uint32), alone[:B].view(np.uint32)), (
                    name,
                    threads,
                    B,
                )
    finally:
        _cpu.set_threads(before)


def test_the_setting_reaches_the_backend_and_get_health_says_so(client):
    """PANTHEON_ACTIVATIONS goes through configure_activations at start (asgi.py); a
    backend already built switches at once, and GET / reports what is in use."""
    import kernels
    from kernels.cpu.backend import configure_activations, requested_activations

    if kernels.kernel_name() != "cpu":
        pytest.skip("the compiled CPU kernels are not the default backend here")
    with pytest.raises(ValueError, match="use float32 or bfloat16"):
        configure_activations("fp16")
    try:
        used = configure_activations("bfloat16")
        assert requested_activations() == "bfloat16"
        assert used == ("bfloat16" if HAS_BF16 else "float32")
        assert client.get("/").json()["kernel_activations"] == used
    finally:
        configure_activations("float32")
    assert client.get("/").json()["kernel_activations"] == "float32"
