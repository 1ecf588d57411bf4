"""The `draft_model` load option (speculative decoding's draft model, a GGUF with the
served model's vocabulary): on the load route, the operator row, the database store, and
its refusals (another vocabulary, a file outside the model folders or missing). Tiny real
GGUFs: tiny.gguf and other.gguf share their byte-level vocabulary."""

from __future__ import annotations

from tests.operators.helpers import error_of
from tests.tiny_gguf import write_tiny_llama

LOAD = "/admin/models/load"


def test_a_draft_model_loads_beside_its_model_and_shows_on_its_row(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "name": "drafted", "draft_model": "other.gguf"})
    assert response.status_code == 200, response.content
    draft = response.json()["speculation"]["draft_model"]
    assert draft["path"] == str(model_dir / "other.gguf")
    assert draft["architecture"] == "llama"
    assert (draft["drafted_tokens"], draft["acceptance_rate"]) == (0, None)
    svc = rt.services()["drafted"]
    assert svc.draft is not None and svc.config.draft_model == str(model_dir / "other.gguf")
    chat = api.post(
        "/v1/chat/completions",
        {"model": "drafted", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    assert chat.status_code == 200, chat.content
    plain = api.post(LOAD, {"path": "tiny.gguf", "name": "plain"})
    assert plain.json()["speculation"]["draft_model"] is None


def test_a_draft_of_another_vocabulary_is_a_400(api, rt, model_dir):
    write_tiny_llama(model_dir / "padded.gguf", n_vocab=300)
    response = api.post(LOAD, {"path": "tiny.gguf", "draft_model": "padded.gguf"})
    message = error_of(response, 400, "load_failed")
    assert "draft_model" in message and "vocabulary" in message
    assert "tiny" not in rt.services()


def test_a_draft_outside_the_folders_or_missing_is_refused(api, rt, model_dir, tmp_path):
    outside = write_tiny_llama(tmp_path / "outside.gguf")
    response = api.post(LOAD, {"path": "tiny.gguf", "draft_model": str(outside)})
    assert "draft_model" in error_of(response, 403, "load_failed")
    response = api.post(LOAD, {"path": "tiny.gguf", "draft_model": "nothing.gguf"})
    assert "draft_model" in error_of(response, 404, "load_failed")


def test_the_store_keeps_the_draft_model_for_the_next_start(api, db_rt, model_dir):
    from operators.models import ServedModel
    from operators.store import spec_of

    response = api.post(LOAD, {"path": "tiny.gguf", "name": "d", "draft_model": "other.gguf"})
    assert response.status_code == 200, response.content
    kept = spec_of(ServedModel.objects.get(name="d")).config.draft_model
    assert kept == str(model_dir / "other.gguf")
