"""The operator routes over HTTP (in-process): every status code of the contract, the
rows, aliases standing in for models on /v1/chat/completions. Tiny real GGUFs."""

from __future__ import annotations

import json
import threading
import time

import pytest

import kernels
from tests.operators.helpers import FakeService, error_of
from tests.tiny_gguf import write_tiny_llama

LOAD, UNLOAD, PIN = "/admin/models/load", "/admin/models/unload", "/admin/models/pin"
HI = [{"role": "user", "content": "hi"}]


def load(api, **body):
    return api.post(LOAD, {"path": "tiny.gguf", **body})


# --- POST /admin/models/load ---------------------------------------------------------


def test_a_load_answers_with_the_operator_row(api, rt, model_dir):
    response = load(
        api,
        name="chat",
        ctx_cap=128,
        max_sessions=2,
        max_concurrent=2,
        reasoning_budget=64,
        pinned=True,
    )
    assert response.status_code == 200, response.content
    row = response.json()
    assert row["id"] == "chat" and row["object"] == "model" and row["status"] == "loaded"
    assert row["path"] == str(model_dir / "tiny.gguf")
    assert row["architecture"] == "llama" and len(row["weights_version"]) == 16
    assert row["dies"] == [] and row["vram_bytes"] == 0
    assert row["host_bytes"] == rt.services()["chat"].memory_bytes > 0
    served = rt.services()["chat"]
    # max_concurrent is what the engine serves; the configured one is what was asked.
    assert row["max_sessions"] == 2 and row["max_concurrent_configured"] == 2
    assert row["max_concurrent"] == served.max_concurrent
    assert (row["context_window"], row["context_window_configured"]) == (128, 128)
    assert row["reasoning_budget"] == 64 and row["quantize"] is False
    assert row["pinned"] is True and row["in_flight"] == 0 and row["aliases"] == []
    assert row["loaded_at"] > 0

    # /v1/models sees it at once, with the served max_concurrent.
    listed = api.get("/v1/models").json()["data"]
    assert [(m["id"], m["max_concurrent"]) for m in listed] == [("chat", served.max_concurrent)]


def test_a_reload_comes_from_the_weight_cache_and_the_row_says_so(
    api, rt, model_dir, settings, tmp_path
):
    settings.PANTHEON_ENGINE_OPTIONS = {
        **settings.PANTHEON_ENGINE_OPTIONS,
        "weight_cache_dir": str(tmp_path / "weight-cache"),
    }
    first = load(api, name="chat").json()
    assert first["quantization"] == "F32" and first["architecture"] == "llama"
    assert first["load_seconds"] > 0 and first["weight_cache_used"] is False
    assert api.post(UNLOAD, {"name": "chat"}).status_code == 200
    second = load(api, name="chat").json()
    assert second["weight_cache_used"] is True
    assert second["weights_version"] == first["weights_version"]


def test_defaults_name_the_model_after_its_file_and_clamp_the_window(api, rt, model_dir):
    row = load(api, ctx_cap=100_000).json()
    assert row["id"] == "tiny"
    # Asked for 100000 tokens; the GGUF was trained for 256: both numbers are shown.
    assert (row["context_window"], row["context_window_configured"]) == (256, 100_000)
    assert row["max_sessions"] == 4 and row["max_concurrent_configured"] == 4
    assert row["pinned"] is False


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{oops",
        b"[]",
        b'{"name": "x"}',
        b'{"path": ""}',
        b'{"path": 3}',
        b'{"path": "tiny.gguf", "ctx_cap": -1}',
        b'{"path": "tiny.gguf", "ctx_cap": "512"}',
        b'{"path": "tiny.gguf", "pinned": "yes"}',
        b'{"path": "tiny.gguf", "dies": [0,1,2,3,4,5,6,7,8]}',
        b'{"path": "tiny.gguf", "dies": [-1]}',
    ],
)
def test_bad_load_requests_are_400_invalid_request(api, rt, model_dir, body):
    error_of(api.post(LOAD, body), 400, "invalid_request_error")
    assert rt.states() == {}


def test_too_many_dies_says_so(api, rt, model_dir):
    message = error_of(load(api, dies=list(range(9))), 400, "invalid_request_error")
    assert "too many dies" in message


@pytest.mark.skipif(kernels.dies_visible() > 0, reason="this host has accelerator dies")
def test_dies_without_an_accelerator_are_400_load_failed(api, rt, model_dir):
    message = error_of(load(api, dies=[0]), 400, "load_failed")
    assert "no accelerator dies" in message


def test_quantize_on_the_numpy_engine_is_400_load_failed(api, rt, model_dir, settings):
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "backend": "numpy"}
    assert "float32" in error_of(load(api, quantize=True), 400, "load_failed")
    assert load(api, quantize=False).status_code == 200


def test_quantize_on_the_compiled_kernels_loads_smaller(api, rt, model_dir):
    if kernels.kernel_name() != "cpu":
        pytest.skip("the compiled CPU kernels are not built")
    row = load(api, quantize=True).json()
    assert row["quantize"] is True and row["kernel"] == "cpu"
    assert row["kernel_activations"] == "float32"  # the default: exact products
    plain = load(api, name="plain").json()
    assert row["host_bytes"] < plain["host_bytes"]


def test_paths_outside_the_model_folders_are_403(api, rt, model_dir, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_tiny_llama(outside / "evil.gguf")
    (model_dir / "escape.gguf").symlink_to(outside / "evil.gguf")
    for path in [
        str(outside / "evil.gguf"),
        f"{model_dir}/../elsewhere/evil.gguf",
        "../elsewhere/evil.gguf",
        str(model_dir / "escape.gguf"),
        "/etc/passwd",
    ]:
        message = error_of(load(api, path=path), 403, "load_failed")
        assert str(model_dir) in message, message
    assert api.get("/v1/models").json()["data"] == []


def test_a_missing_file_is_404(api, rt, model_dir):
    assert "not found" in error_of(load(api, path="nope.gguf"), 404, "load_failed")


def test_a_file_that_is_not_a_model_is_500_load_failed(api, rt, model_dir):
    (model_dir / "junk.gguf").write_bytes(b"this is not a GGUF file")
    message = error_of(load(api, path="junk.gguf"), 500, "load_failed")
    assert "junk.gguf" in message


def test_an_unsupported_architecture_is_400_load_failed_naming_it(api, rt, model_dir):
    """Issue 36 item 9: a GGUF of an architecture this engine lacks is the file's fault,
    not the server's: 400 naming it and the supported ones (was 500)."""
    import gguf
    import numpy as np

    path = model_dir / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), arch="mamba")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    message = error_of(load(api, path="mamba.gguf"), 400, "load_failed")
    assert "'mamba'" in message and "supported: " in message and "llama" in message


def test_loading_a_loaded_name_is_409(api, rt, model_dir):
    assert load(api, name="chat").status_code == 200
    assert "already loaded" in error_of(load(api, name="chat"), 409, "load_failed")


def test_a_load_beyond_the_limit_with_only_pinned_models_is_409(api, rt, model_dir, settings):
    settings.PANTHEON_MAX_LOADED_MODELS = 1
    assert load(api, name="a", pinned=True).status_code == 200
    message = error_of(load(api, name="b"), 409, "load_failed")
    assert "a (pinned)" in message


def test_a_load_that_does_not_fit_is_507(api, rt, model_dir, settings):
    settings.PANTHEON_MEMORY_RESERVE_BYTES = 1 << 60
    message = error_of(load(api), 507, "load_failed")
    assert "needs about" in message and "are free" in message


def test_a_load_of_a_loading_name_is_409(api, rt, model_dir, monkeypatch):
    gate = threading.Event()
    real_open = type(rt)._open
    monkeypatch.setattr(
        type(rt), "_open", lambda self, spec: gate.wait(10) and real_open(self, spec)
    )
    first = threading.Thread(target=lambda: rt.load(_spec("chat")))
    first.start()
    try:
        deadline = time.monotonic() + 5
        while "chat" not in rt.states() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "already loading" in error_of(load(api, name="chat"), 409, "load_failed")
        assert api.get("/").json()["models"] == {"chat": "loading"}
    finally:
        gate.set()
        first.join(10)


def _spec(name, path="tiny.gguf"):
    from pantheon_platform.runtime import LoadSpec

    return LoadSpec.of(name=name, path=path)


# --- POST /admin/models/unload --------------------------------------------------------


def test_unload_frees_the_name(api, rt, model_dir):
    load(api, name="chat")
    svc = rt.services()["chat"]
    response = api.post(UNLOAD, {"name": "chat"})
    assert response.status_code == 200
    assert response.json() == {"unloaded": "chat", "drained": True}
    assert api.get("/v1/models").json()["data"] == []
    assert not svc._thread.is_alive()


@pytest.mark.parametrize("body", [b"", b"{oops", b"[]", b"{}", b'{"name": 3}'])
def test_bad_unload_requests_are_400(api, rt, body):
    error_of(api.post(UNLOAD, body), 400, "invalid_request_error")


def test_unloading_an_unknown_name_is_404(api, rt):
    error_of(api.post(UNLOAD, {"name": "nope"}), 404, "unload_failed")


def test_unloading_twice_is_409_and_the_first_waits_for_the_generation(api, rt):
    busy = FakeService("busy", in_flight=1)
    rt.register("busy", busy)
    first = threading.Thread(target=lambda: api.post(UNLOAD, {"name": "busy"}))
    first.start()
    deadline = time.monotonic() + 5
    while rt.states()["busy"].state != "unloading" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "already unloading" in error_of(api.post(UNLOAD, {"name": "busy"}), 409, "unload_failed")
    rows = api.get("/admin/models").json()["data"]
    assert [(r["id"], r["status"], r["in_flight"]) for r in rows] == [("busy", "unloading", 1)]
    busy.in_flight = 0
    first.join(5)
    assert busy.closed and api.get("/admin/models").json()["data"] == []


def test_an_unload_past_its_timeout_says_it_is_still_draining(api, rt, settings):
    settings.PANTHEON_UNLOAD_TIMEOUT = 0.1
    busy = FakeService("busy", in_flight=2)
    rt.register("busy", busy)
    response = api.post(UNLOAD, {"name": "busy"})
    assert response.json() == {"unloaded": "busy", "drained": False, "in_flight": 2}
    busy.in_flight = 0


def test_unloading_a_model_that_failed_at_start_forgets_it(api, rt, model_dir):
    rt.start_loading([_spec("broken", path="missing.gguf")])
    assert rt.wait_loaded(10)
    assert api.get("/").json()["models"] == {"broken": "failed"}
    assert api.post(UNLOAD, {"name": "broken"}).json()["unloaded"] == "broken"
    assert api.get("/").json()["models"] == {}


# --- GET /admin/models, pin ------------------------------------------------------------


def test_admin_models_lists_every_live_instance(api, rt, model_dir):
    assert api.get("/admin/models").json() == {"object": "list", "data": []}
    load(api, name="b")
    load(api, name="a", path="other.gguf")
    api.post("/admin/aliases", {"alias": "fast", "target": "a"})
    rows = api.get("/admin/models").json()["data"]
    assert [(r["id"], r["aliases"]) for r in rows] == [("a", ["fast"]), ("b", [])]
    assert "graphs" not in rows[0] and "attention" not in rows[0]  # no such thing on numpy


def test_pin_and_unpin(api, rt, model_dir):
    load(api, name="chat")
    assert api.post(PIN, {"name": "chat", "pinned": True}).json() == {
        "name": "chat",
        "pinned": True,
    }
    assert api.get("/admin/models").json()["data"][0]["pinned"] is True
    api.post(PIN, {"name": "chat", "pinned": False})
    assert rt.instance("chat").pinned is False
    error_of(api.post(PIN, {"name": "nope", "pinned": True}), 404, "model_not_found")
    error_of(api.post(PIN, {"name": "chat"}), 400, "invalid_request_error")
    error_of(api.post(PIN, {"name": "chat", "pinned": 1}), 400, "invalid_request_error")


# --- aliases -----------------------------------------------------------------------------


def test_aliases_are_listed_created_and_deleted(api, rt, model_dir):
    load(api, name="chat")
    assert api.get("/admin/aliases").json() == {"object": "list", "data": []}
    assert api.post("/admin/aliases", {"alias": "gpt-4o", "target": "chat"}).json() == {
        "alias": "gpt-4o",
        "target": "chat",
    }
    api.post("/admin/aliases", {"alias": "org/model", "model": "gpt-4o"})  # Lemonade's key
    assert api.get("/admin/aliases").json()["data"] == [
        {"alias": "gpt-4o", "target": "chat", "resolves_to": "chat", "loaded": True},
        {"alias": "org/model", "target": "gpt-4o", "resolves_to": "chat", "loaded": True},
    ]
    assert api.delete("/admin/aliases/org/model").json() == {"deleted": "org/model"}
    assert [a["alias"] for a in api.get("/admin/aliases").json()["data"]] == ["gpt-4o"]
    error_of(api.delete("/admin/aliases/org/model"), 404, "alias_not_found")


@pytest.mark.parametrize(
    ("body", "status", "type_"),
    [
        ({"alias": "", "target": "chat"}, 400, "invalid_request_error"),
        ({"alias": "x"}, 400, "invalid_request_error"),
        ({"alias": "x", "target": "  "}, 400, "invalid_request_error"),
        ({"alias": "x", "target": "x"}, 400, "invalid_alias"),
        ({"alias": "chat", "target": "other"}, 409, "alias_conflict"),
        ({"alias": "b", "target": "a"}, 409, "alias_conflict"),  # a -> b already: a cycle
    ],
)
def test_bad_aliases_are_refused(api, rt, model_dir, body, status, type_):
    load(api, name="chat")
    api.post("/admin/aliases", {"alias": "a", "target": "b"})
    error_of(api.post("/admin/aliases", body), status, type_)


def test_an_alias_deeper_than_ten_links_is_409(api, rt):
    for i in range(10):
        assert (
            api.post("/admin/aliases", {"alias": f"x{i}", "target": f"x{i + 1}"}).status_code == 200
        )
    message = error_of(
        api.post("/admin/aliases", {"alias": "top", "target": "x0"}), 409, "alias_conflict"
    )
    assert "11 links" in message


def test_an_alias_stands_in_for_its_model_in_chat_completions(api, rt, model_dir):
    load(api, name="tiny")
    load(api, name="other", path="other.gguf")
    api.post("/admin/aliases", {"alias": "gpt-4o", "target": "other"})
    body = {"model": "gpt-4o", "messages": HI, "max_tokens": 2, "temperature": 0}
    response = api.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert response.json()["model"] == "other"
    # An alias is routed, never listed: /v1/models shows served names only.
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["other", "tiny"]
    # An alias is accepted wherever a model name is: unload too.
    assert api.post(UNLOAD, {"name": "gpt-4o"}).json()["unloaded"] == "other"


# --- dies, available files --------------------------------------------------------------


def test_dies_on_a_cpu_host(api):
    if kernels.dies_visible():
        pytest.skip("this host has accelerator dies")
    assert api.get("/admin/dies").json() == {"object": "list", "n_dies": 0, "data": []}


def test_available_lists_the_gguf_files_in_the_model_folders(api, rt, model_dir, tmp_path):
    (model_dir / "sub").mkdir()
    write_tiny_llama(model_dir / "sub" / "deep.gguf", context_length=512)
    (model_dir / "junk.gguf").write_bytes(b"not a model")
    (model_dir / "readme.txt").write_text("not listed")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_tiny_llama(outside / "evil.gguf")
    (model_dir / "escape.gguf").symlink_to(outside / "evil.gguf")  # could not load: not listed
    load(api, name="chat")

    rows = {row["path"]: row for row in api.get("/admin/models/available").json()["data"]}
    assert sorted(rows) == [
        str(model_dir / name) for name in ["junk.gguf", "other.gguf", "sub/deep.gguf", "tiny.gguf"]
    ]
    tiny = rows[str(model_dir / "tiny.gguf")]
    assert tiny == {
        "path": str(model_dir / "tiny.gguf"),
        "name": "tiny",
        "size_bytes": (model_dir / "tiny.gguf").stat().st_size,
        "architecture": "llama",
        "quantization": "F32",
        "n_params": tiny["n_params"],
        "context_length": 256,
        "loaded": True,
        "loaded_as": ["chat"],
    }
    assert tiny["n_params"] > 0
    assert rows[str(model_dir / "sub/deep.gguf")]["context_length"] == 512
    assert rows[str(model_dir / "other.gguf")]["loaded"] is False
    assert "junk.gguf" in rows[str(model_dir / "junk.gguf")]["error"]


def test_the_shipped_model_reports_its_quantisation(api, rt, settings, smollm2_path):
    settings.PANTHEON_MODEL_DIRS = [smollm2_path.parent]
    [row] = [
        r
        for r in api.get("/admin/models/available").json()["data"]
        if r["name"].startswith("SmolLM2")
    ]
    assert (row["architecture"], row["quantization"], row["context_length"]) == (
        "llama",
        "Q4_1",
        8192,
    )
    assert row["n_params"] == 134_515_008


# --- the HTTP edges ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", LOAD),
        ("get", UNLOAD),
        ("post", "/admin/models"),
        ("post", "/admin/dies"),
        ("delete", "/admin/aliases"),
        ("get", "/admin/aliases/x"),
    ],
)
def test_wrong_methods_are_405(api, rt, method, path):
    response = getattr(api.client, method)(path)
    error_of(response, 405, "method_not_allowed")
    assert response["Access-Control-Allow-Origin"] == "*"


def test_operator_routes_need_no_csrf_token_and_carry_cors(api, rt, model_dir):
    response = api.post(LOAD, json.dumps({"path": "tiny.gguf"}))
    assert response.status_code == 200
    assert response["Access-Control-Allow-Origin"] == "*"
