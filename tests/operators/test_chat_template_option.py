"""The `chat_template` load option (llama.cpp's --chat-template-file): a template's text or
a file in a model folder replaces the GGUF's template; a restart reads the file again.
The real SmolLM2 for what the prompt becomes; tiny GGUFs for the refusals and the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.models import ServedModel
from operators.store import DatabaseStore
from pantheon_platform.runtime import MAX_CHAT_TEMPLATE_BYTES, LoadSpec, Runtime
from tests.operators.helpers import error_of

LOAD = "/admin/models/load"
HI = [{"role": "user", "content": "Hi"}]

# ChatML with a think block opened after the generation prompt (DeepSeek-R1 style).
THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
THINK_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"


@pytest.fixture
def smol(model_dir, smollm2_path, settings) -> Path:
    """SmolLM2's folder is a model folder too; templates go in model_dir."""
    settings.PANTHEON_MODEL_DIRS = [model_dir, smollm2_path.parent]
    return smollm2_path


def test_a_template_string_replaces_the_ggufs(api, rt, smol):
    response = api.post(
        LOAD, {"path": str(smol), "name": "thinker", "chat_template": THINK_TEMPLATE}
    )
    assert response.status_code == 200, response.content
    assert response.json()["chat_template"] == "custom"
    svc = rt.services()["thinker"]
    assert svc.template.source == THINK_TEMPLATE
    assert svc.template.eos_token == "<|im_end|>"  # the GGUF's bos/eos texts still bound
    ids = svc.encode_chat(HI)
    assert ids == svc.tokenizer.encode(THINK_PROMPT)
    assert "<think>" in svc.tokenizer.decode(ids)
    assert rt.instance("thinker").spec.config.chat_template == THINK_TEMPLATE


def test_a_template_file_in_a_model_folder_replaces_the_ggufs(api, rt, smol, model_dir):
    (model_dir / "think.jinja").write_text(THINK_TEMPLATE, encoding="utf-8")
    response = api.post(
        LOAD, {"path": str(smol), "name": "thinker", "chat_template": "think.jinja"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["chat_template"] == "custom"
    svc = rt.services()["thinker"]
    assert svc.encode_chat(HI) == svc.tokenizer.encode(THINK_PROMPT)
    # The spec keeps what the operator sent; the engine got the text.
    assert rt.instance("thinker").spec.config.chat_template == "think.jinja"


def test_without_the_option_the_ggufs_template_is_used(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "chat_template": ""})
    assert response.status_code == 200, response.content
    assert response.json()["chat_template"] == "gguf"
    assert api.get("/admin/models").json()["data"][0]["chat_template"] == "gguf"


@pytest.mark.parametrize(
    ("template", "status", "says"),
    [
        ("missing.jinja", 404, "no such file"),
        ("sub", 404, "no such file"),  # a folder
        ("../outside.jinja", 403, "outside the model folders"),
        ("{% for %}", 400, "invalid chat template"),
        ("{{ messages[0] ", 400, "invalid chat template"),
        ("binary.jinja", 400, "not UTF-8"),
        ("huge.jinja", 400, "bytes"),
    ],
)
def test_a_bad_template_is_refused_before_loading(api, rt, model_dir, template, status, says):
    (model_dir / "sub").mkdir()
    (model_dir.parent / "outside.jinja").write_text(THINK_TEMPLATE)
    (model_dir / "binary.jinja").write_bytes(b"{{ x }}\xff\xfe")
    (model_dir / "huge.jinja").write_text("{{ x }}" + " " * MAX_CHAT_TEMPLATE_BYTES)
    response = api.post(LOAD, {"path": "tiny.gguf", "chat_template": template})
    assert says in error_of(response, status, "load_failed")
    assert rt.services() == {}


def test_an_absolute_path_outside_the_folders_is_403(api, rt, model_dir, tmp_path):
    outside = tmp_path / "elsewhere.jinja"
    outside.write_text(THINK_TEMPLATE)
    response = api.post(LOAD, {"path": "tiny.gguf", "chat_template": str(outside)})
    error_of(response, 403, "load_failed")


def test_a_non_string_template_is_400(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "chat_template": ["{{ x }}"]})
    assert response.status_code == 400, response.content
    assert rt.services() == {}


def test_the_engine_refuses_a_template_that_does_not_compile(model_dir):
    from engine import ModelConfig
    from engine.serving.service import ModelService
    from engine.types import ModelLoadError

    config = ModelConfig(name="x", path=str(model_dir / "tiny.gguf"), chat_template="{% if %}")
    with pytest.raises(ModelLoadError, match="chat_template"):
        ModelService.load(config)


def test_a_restart_keeps_the_option_and_reads_the_file_again(db_rt, model_dir):
    template = model_dir / "chat.jinja"
    template.write_text(THINK_TEMPLATE)
    db_rt.load(LoadSpec.of(name="chat", path="tiny.gguf", chat_template="chat.jinja"))
    db_rt.load(LoadSpec.of(name="inline", path="tiny.gguf", chat_template=THINK_TEMPLATE))
    assert ServedModel.objects.get(name="chat").chat_template == "chat.jinja"
    assert ServedModel.objects.get(name="inline").chat_template == THINK_TEMPLATE
    assert db_rt.services()["chat"].template.source == THINK_TEMPLATE
    db_rt.close()

    edited = THINK_TEMPLATE.replace("<think>", "<reflect>")
    template.write_text(edited)
    after = Runtime(DatabaseStore())
    after.start_loading()
    try:
        assert after.wait_loaded(30)
        assert after.services()["chat"].template.source == edited
        assert after.services()["inline"].template.source == THINK_TEMPLATE
        assert after.instance("chat").spec.config.chat_template == "chat.jinja"
    finally:
        after.close()
