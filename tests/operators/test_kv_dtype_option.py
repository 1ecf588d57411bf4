"""The `kv_dtype` load option (the KV cache's type): on the load route, the operator row,
the database store, the memory estimate, and the refusals. Tiny real GGUFs."""

from __future__ import annotations

import pytest

from pantheon_platform.model_files import model_file_info
from pantheon_platform.runtime.devices import kv_row_bytes
from tests.operators.helpers import error_of
from tests.tiny_gguf import write_tiny_llama

LOAD = "/admin/models/load"


@pytest.fixture
def wide(model_dir):
    """A tiny llama with heads of 32 values (one Q8_0 block each)."""
    write_tiny_llama(model_dir / "wide.gguf", d_model=128, n_head=4, n_kv_head=2)
    return "wide.gguf"


def test_kv_dtype_is_a_load_option_with_an_exact_default(api, rt, model_dir, wide):
    rows = {}
    for kv_dtype in (None, "f16", "q8_0"):
        body = {"path": wide, "name": f"kv-{kv_dtype}"}
        if kv_dtype:
            body["kv_dtype"] = kv_dtype
        response = api.post(LOAD, body)
        assert response.status_code == 200, response.content
        rows[kv_dtype] = response.json()
        assert rt.services()[f"kv-{kv_dtype}"].kv.kv_dtype == (kv_dtype or "f32")
    assert rows[None]["kv_dtype"] == "f32"
    assert [rows[t]["kv_dtype"] for t in ("f16", "q8_0")] == ["f16", "q8_0"]
    per_token = {t: rows[t]["kv_bytes_per_token"] for t in rows}
    assert per_token[None] == 2 * 2 * 2 * 32 * 4  # K and V, 2 layers, 2 heads of 32
    assert per_token[None] == 2 * per_token["f16"]
    assert per_token[None] * 34 == per_token["q8_0"] * 128  # 34 bytes per 32 values
    chat = {"model": "kv-q8_0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert api.post("/v1/chat/completions", chat).status_code == 200


def test_an_unknown_kv_dtype_is_a_400(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "kv_dtype": "int4"})
    assert "kv_dtype" in error_of(response, 400, "invalid_request_error")
    assert rt.states() == {}


def test_q8_0_on_heads_that_are_not_whole_blocks_is_a_400(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "kv_dtype": "q8_0"})  # heads of 8
    message = error_of(response, 400, "load_failed")  # refused before any weight is read
    assert "multiple of 32" in message and "(this model's is 8)" in message
    assert rt.states() == {}


def test_the_store_keeps_the_kv_dtype_for_the_next_start(api, db_rt, model_dir):
    from operators.models import ServedModel
    from operators.store import spec_of

    response = api.post(LOAD, {"path": "tiny.gguf", "name": "half", "kv_dtype": "f16"})
    assert response.status_code == 200, response.content
    assert spec_of(ServedModel.objects.get(name="half")).config.kv_dtype == "f16"


def test_the_memory_estimate_fits_2x_the_sessions_with_f16_and_3_8x_with_q8_0(smollm2_path):
    info = model_file_info(smollm2_path)
    weights = info.weight_bytes("cpu")
    per_session = {
        t: info.estimate_bytes(4096, 1, "cpu", kv_row_bytes(t, info.head_dim)) - weights
        for t in ("f32", "f16", "q8_0")
    }
    assert per_session["f32"] == 2 * 30 * 3 * 64 * 4 * 4096  # SmolLM2: 46,080 B a token
    budget = 45 * per_session["f32"]  # ~8.3 GB of KV: 45 sessions of 4k tokens in f32
    fit = {t: budget // n for t, n in per_session.items()}
    assert fit == {"f32": 45, "f16": 90, "q8_0": 169}  # x2, x3.76
    assert info.estimate_bytes(4096, 1, "cpu") == info.estimate_bytes(
        4096, 1, "cpu", kv_row_bytes("f32", info.head_dim)
    )
