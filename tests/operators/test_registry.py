"""pantheon_platform.runtime as the operators' registry: LRU eviction and pins, aliases, the model
folders, admission, serialised loads and draining unloads. Tiny real GGUFs; a stand-in
service only where a generation must be "running" for as long as the test says."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import kernels
from pantheon_platform.model_files import model_file_info
from pantheon_platform.runtime import (
    Conflict,
    InsufficientMemory,
    InvalidOption,
    LoadSpec,
    ModelNotFound,
    NotFound,
    PathNotAllowed,
)
from tests.operators.helpers import FakeService
from tests.tiny_gguf import write_tiny_llama


def spec(name: str, path: str = "tiny.gguf", **options) -> LoadSpec:
    return LoadSpec.of(name=name, path=path, **options)


def loaded(rt) -> set[str]:
    return set(rt.services())


# --- LRU eviction and pins -------------------------------------------------------


def test_lru_eviction_skips_pinned_models_and_follows_use(rt, model_dir, settings):
    settings.PANTHEON_MAX_LOADED_MODELS = 3
    rt.load(spec("a", pinned=True))  # the oldest, but pinned
    rt.load(spec("b"))
    rt.load(spec("c"))
    rt.resolve("b")  # a request routed to b: c is now the least recently used
    c_service = rt.services()["c"]

    rt.load(spec("d"))
    assert loaded(rt) == {"a", "b", "d"}
    assert rt.instance("c") is None and rt.states().get("c") is None
    rt.load(spec("e"))
    assert loaded(rt) == {"a", "d", "e"}
    rt.load(spec("f"))
    assert loaded(rt) == {"a", "e", "f"}
    # An evicted model is really freed: its engine thread has stopped.
    assert not c_service._thread.is_alive()


def test_when_only_pinned_or_busy_models_remain_a_load_is_refused(rt, model_dir, settings):
    settings.PANTHEON_MAX_LOADED_MODELS = 2
    rt.load(spec("a", pinned=True))
    rt.register("busy", FakeService("busy", in_flight=1))
    with pytest.raises(Conflict) as refused:
        rt.load(spec("c"))
    message = str(refused.value)
    assert "PANTHEON_MAX_LOADED_MODELS=2" in message
    assert "a (pinned)" in message and "busy (busy: 1 in flight)" in message
    assert loaded(rt) == {"a", "busy"} and "c" not in rt.states()

    rt.set_pinned("a", False)  # now a can make room
    rt.load(spec("c"))
    assert loaded(rt) == {"busy", "c"}


def test_pinning_an_unknown_model_is_not_found(rt):
    with pytest.raises(NotFound):
        rt.set_pinned("nope", True)


# --- aliases ---------------------------------------------------------------------


def test_an_alias_chain_routes_to_its_model(rt, model_dir):
    rt.load(spec("a"))
    rt.load(spec("b"))
    rt.set_alias("first", "second")
    rt.set_alias("second", "b")
    assert rt.resolve("first")[0] == "b"
    assert rt.resolve("second")[0] == "b"
    assert rt.instance("b").aliases == ("first", "second")
    rt.set_alias("first", "a")  # re-pointing replaces the target
    assert rt.resolve("first")[0] == "a"
    rt.delete_alias("first")
    with pytest.raises(ModelNotFound):
        rt.resolve("first")


@pytest.mark.parametrize(
    ("alias", "target", "error", "words"),
    [
        ("", "a", InvalidOption, "blank"),
        ("x", "  ", InvalidOption, "blank"),
        ("x", "x", InvalidOption, "itself"),
        ("a", "b", Conflict, "loaded model"),
        ("loop2", "loop1", Conflict, "cycle"),
    ],
)
def test_bad_aliases_are_refused(rt, model_dir, alias, target, error, words):
    rt.load(spec("a"))
    rt.set_alias("loop1", "loop2")
    with pytest.raises(error, match=words):
        rt.set_alias(alias, target)


def test_alias_chains_are_at_most_ten_links_deep(rt):
    # x1 -> x2 -> ... -> x10 -> model: ten links.
    for i in range(10, 0, -1):
        rt.set_alias(f"x{i}", f"x{i + 1}" if i < 10 else "model")
    with pytest.raises(Conflict, match="11 links"):
        rt.set_alias("x0", "x1")
    with pytest.raises(Conflict, match="11 links"):  # lengthening from the far end too
        rt.set_alias("model", "elsewhere")
    assert "x0" not in rt.aliases()


def test_a_model_cannot_load_under_an_alias_name(rt, model_dir):
    rt.set_alias("chat", "a")
    with pytest.raises(Conflict, match="alias"):
        rt.load(spec("chat"))
    with pytest.raises(NotFound):
        rt.delete_alias("nope")


# --- the model folders -----------------------------------------------------------


def test_only_files_inside_the_model_folders_load(rt, model_dir, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_tiny_llama(outside / "evil.gguf")
    (model_dir / "escape.gguf").symlink_to(outside / "evil.gguf")
    (model_dir / "alias.gguf").symlink_to(model_dir / "tiny.gguf")

    for path in [
        str(outside / "evil.gguf"),  # outside
        f"{model_dir}/../elsewhere/evil.gguf",  # a `..` climbing out
        "../elsewhere/evil.gguf",  # relative, looked up in the folders, climbing out
        str(model_dir / "escape.gguf"),  # a symlink pointing out
    ]:
        with pytest.raises(PathNotAllowed) as refused:
            rt.load(spec("x", path))
        assert str(model_dir) in str(refused.value)  # names the allowed folders
    assert rt.states() == {}

    assert rt.load(spec("rel", "tiny.gguf")).svc.path == str(model_dir / "tiny.gguf")
    assert rt.load(spec("link", "alias.gguf")).svc.path == str(model_dir / "tiny.gguf")
    with pytest.raises(NotFound):
        rt.load(spec("missing", "missing.gguf"))


# --- admission -------------------------------------------------------------------


def test_the_memory_estimate_is_float32_weights_plus_kv_for_every_session(model_dir):
    info = model_file_info(model_dir / "tiny.gguf")
    # write_tiny_llama's defaults: 2 layers, 2 KV heads of 8 dims, a 256-token context.
    assert (info.n_layer, info.n_kv_head, info.head_dim, info.context_length) == (2, 2, 8, 256)
    kv_per_token = 2 * 2 * 2 * 8 * 4
    assert info.estimate_bytes(0, 3) == info.n_params * 4 + kv_per_token * 256 * 3
    assert info.estimate_bytes(100, 1) == info.n_params * 4 + kv_per_token * 100
    assert info.estimate_bytes(10_000, 1) == info.estimate_bytes(0, 1)  # clamped to 256


def test_a_load_that_does_not_fit_is_refused_with_both_numbers(rt, model_dir, settings):
    settings.PANTHEON_MEMORY_RESERVE_BYTES = 1 << 60
    with pytest.raises(InsufficientMemory) as refused:
        rt.load(spec("a", max_sessions=2))
    need = model_file_info(model_dir / "tiny.gguf").estimate_bytes(0, 2)
    assert f"needs about {need} bytes" in str(refused.value)
    assert "0 bytes (0.00 GiB) are free" in str(refused.value)
    assert rt.states() == {}


def test_file_metadata_is_cached_until_the_file_changes(model_dir):
    path = model_dir / "tiny.gguf"
    first = model_file_info(path)
    assert model_file_info(path) is first
    write_tiny_llama(path, n_layer=4)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert model_file_info(path).n_layer == 4


def test_engine_options_shared_by_every_model_reach_the_engine(settings):
    settings.PANTHEON_ENGINE_OPTIONS = {"prefill_chunk": 7, "not_an_engine_option": 1}
    config = spec("a", ctx_cap=64).engine_config()
    assert (config.name, config.ctx_cap, config.prefill_chunk) == ("a", 64, 7)


# --- options this engine cannot honour ---------------------------------------------


@pytest.mark.skipif(kernels.dies_visible() > 0, reason="this host has accelerator dies")
def test_dies_on_a_host_without_dies_are_refused(rt, model_dir):
    with pytest.raises(InvalidOption, match="no accelerator dies"):
        rt.load(spec("a", dies=(0,)))


def test_quantize_on_the_numpy_engine_is_refused_honestly(rt, model_dir, settings):
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "backend": "numpy"}
    with pytest.raises(InvalidOption, match="float32"):
        rt.load(spec("a", quantize=True))


def test_quantize_keeps_float_matrices_as_q8_0_blocks(rt, model_dir):
    if kernels.kernel_name() != "cpu":
        pytest.skip("the compiled CPU kernels are not built")
    plain = rt.load(spec("plain")).svc
    small = rt.load(spec("small", quantize=True)).svc
    q = small.model.layers[0].attn_output
    assert (q.storage, plain.model.layers[0].attn_output.storage) == ("Q8_0", "f32")
    # Q8_0 holds 34 bytes per 32 values where float32 holds 128.
    assert small.model.weight_bytes < 0.5 * plain.model.weight_bytes
    tokens = np.array([1, 5, 9, 2, 7])
    a = plain.model.forward(tokens, 0, plain.model.make_kv_cache(1, 8), 0, all_logits=True)
    b = small.model.forward(tokens, 0, small.model.make_kv_cache(1, 8), 0, all_logits=True)
    np.testing.assert_allclose(b, a, atol=0.05 * np.abs(a).max())


# --- loads are serialised ----------------------------------------------------------


def test_loads_run_one_at_a_time_and_the_same_name_twice_conflicts(rt, model_dir, monkeypatch):
    gate, inside = threading.Event(), threading.Event()
    real_open = type(rt)._open

    def slow_open(self, spec):
        if spec.name == "first":
            inside.set()
            assert gate.wait(10)
        return real_open(self, spec)

    monkeypatch.setattr(type(rt), "_open", slow_open)
    results: dict[str, object] = {}

    def load(name):
        try:
            results[name] = rt.load(spec(name)).name
        except Exception as exc:
            results[name] = exc

    first = threading.Thread(target=load, args=("first",))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=load, args=("second",))
    second.start()
    time.sleep(0.3)
    assert second.is_alive()  # waiting for the first load, not refused
    assert rt.states() == {"first": _state("loading"), "second": _state("loading")}
    with pytest.raises(Conflict, match="already loading"):
        rt.load(spec("first"))
    gate.set()
    first.join(10)
    second.join(10)
    assert results == {"first": "first", "second": "second"}
    with pytest.raises(Conflict, match="already loaded"):
        rt.load(spec("first"))


def _state(name: str):
    from pantheon_platform.runtime import ModelState

    return ModelState(name)


# --- draining unloads --------------------------------------------------------------


def test_unload_stops_routing_at_once_and_frees_after_the_drain(rt, model_dir):
    rt.load(spec("other"))
    busy = FakeService("busy", in_flight=1)
    rt.register("busy", busy)
    results = []
    unloading = threading.Thread(target=lambda: results.append(rt.unload("busy")))
    unloading.start()
    time.sleep(0.3)

    assert unloading.is_alive() and not busy.closed  # the generation runs on
    assert loaded(rt) == {"other"} and rt.states()["busy"].state == "unloading"
    with pytest.raises(ModelNotFound, match="being unloaded"):
        rt.resolve("busy")  # not silently routed to the one model left
    with pytest.raises(Conflict, match="already unloading"):
        rt.unload("busy")
    with pytest.raises(Conflict, match="still unloading"):
        rt.load(spec("busy"))

    busy.in_flight = 0  # the generation ends
    unloading.join(5)
    assert results[0].drained and busy.closed
    assert rt.instance("busy") is None and "busy" not in rt.states()
    with pytest.raises(NotFound):
        rt.unload("busy")


def test_past_the_timeout_the_drain_finishes_in_the_background(rt):
    busy = FakeService("busy", in_flight=1)
    rt.register("busy", busy)
    result = rt.unload("busy", timeout=0.1)
    assert (result.drained, result.in_flight) == (False, 1)
    assert not busy.closed  # never cut off
    busy.in_flight = 0
    deadline = time.monotonic() + 5
    while not busy.closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert busy.closed and rt.instance("busy") is None
