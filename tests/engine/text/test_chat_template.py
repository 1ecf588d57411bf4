"""Chat templates render like HF transformers; their prompts tokenize to the reference ids."""

from __future__ import annotations

import ast
import json

import pytest

from engine.text.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    normalize_messages,
)


def messages_of(entry) -> list[dict]:
    m = entry["messages"]
    return ast.literal_eval(m) if isinstance(m, str) else m  # a python repr in some dumps


@pytest.fixture(scope="module")
def smollm2_template(smollm2_metadata) -> ChatTemplate:
    return ChatTemplate.from_gguf(smollm2_metadata)


@pytest.fixture(scope="module")
def qwen3_template(reference_dir, gguf_kv) -> ChatTemplate:
    path = reference_dir / "tiny" / "tiny-qwen3.gguf"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return ChatTemplate.from_gguf(gguf_kv(path))


def test_smollm2_template_renders_each_reference_prompt_exactly(smollm2_template, smollm2_f32):
    assert smollm2_f32["greedy"]
    for entry in smollm2_f32["greedy"]:
        assert smollm2_template.render(messages_of(entry)) == entry["text"]


def test_reference_prompts_tokenize_to_the_reference_prompt_ids(
    smollm2_template, smollm2_tokenizer, smollm2_f32
):
    # SmolLM2's bos (id 1) is <|im_start|>, and add_bos_token is false: the leading 1 in
    # prompt_ids is the template's own first <|im_start|>, not an added BOS.
    tok = smollm2_tokenizer
    for entry in smollm2_f32["greedy"]:
        text = smollm2_template.render(messages_of(entry))
        assert tok.encode(text, add_special=True) == tok.encode(text) == entry["prompt_ids"]
        assert entry["prompt_ids"][0] == tok.bos_id == tok.token_id("<|im_start|>")


def test_from_gguf_binds_the_bos_and_eos_texts(small_gguf):
    gguf = pytest.importorskip("gguf")
    template = ChatTemplate.from_gguf(gguf.GGUFReader(small_gguf))
    assert (template.bos_token, template.eos_token) == ("a", "<|im_end|>")
    assert template.render([{"role": "user", "content": "hi"}]) == "ahi"


def test_a_gguf_without_template_gets_chatml():
    template = ChatTemplate.from_gguf({"tokenizer.ggml.tokens": ["x"]})
    assert template.source == CHATML_TEMPLATE
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
    )


def test_all_four_roles_render_in_chatml():
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "T", "tool_call_id": "c1"},
    ]
    out = ChatTemplate(CHATML_TEMPLATE).render(messages, add_generation_prompt=False)
    assert out == "".join(
        f"<|im_start|>{r}\n{c}<|im_end|>\n"
        for r, c in zip("system user assistant tool".split(), "SUAT", strict=True)
    )


def test_normalize_fills_a_missing_role_with_user():
    assert normalize_messages([{"content": "x"}, {"role": None, "content": "y"}]) == [
        {"role": "user", "content": "x"},
        {"role": "user", "content": "y"},
    ]


def test_normalize_joins_text_parts_and_drops_the_rest():
    parts = [
        {"type": "text", "text": "Hello, "},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        "world",
        {"type": "text", "text": "!"},
    ]
    assert normalize_messages([{"role": "user", "content": parts}])[0]["content"] == "Hello, world!"


@pytest.mark.parametrize("content", [None, 42, 1.5, {"a": 1}, True])
def test_normalize_turns_other_content_into_empty_text(content):
    assert normalize_messages([{"role": "assistant", "content": content}])[0]["content"] == ""
    assert normalize_messages([{"role": "assistant"}])[0]["content"] == ""


def test_normalize_keeps_extra_keys_and_leaves_the_input_alone():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    given = [
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "r"},
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "f"},
    ]
    out = normalize_messages(given)
    assert out[0] == {**given[0], "content": ""}
    assert out[1] == given[1]
    assert given[0]["content"] is None


def test_raise_exception_becomes_chat_template_error():
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ChatTemplateError, match="^first must be user$"):
        template.render([{"role": "system", "content": ""}])


def test_undefined_and_type_errors_become_chat_template_error():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].nope + 'x' }}").render([{"role": "user"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0].content + 1 }}").render([{"role": "user"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[5].content.upper() }}").render([])


def test_a_syntax_error_is_reported_at_construction():
    with pytest.raises(ChatTemplateError, match="invalid chat template"):
        ChatTemplate("{% for m in messages %}")


def test_the_sandbox_refuses_unsafe_attribute_access():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% set _ = messages.append(1) %}").render([])


def test_blocks_are_trimmed_like_hf():
    template = ChatTemplate(
        "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n{% endif %}\n{% endfor %}"
    )
    assert template.render([{"content": "a"}, {"content": "b"}]) == "a\nb\n"


def test_tojson_keeps_non_ascii_and_key_order():
    template = ChatTemplate("{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}")
    tool = {"name": "météo", "b": 1, "a": "<x>"}
    assert template.render([], tools=[tool]) == (
        json.dumps(tool, ensure_ascii=False) + "|" + json.dumps(tool, ensure_ascii=False, indent=2)
    )


def test_strftime_now_loop_controls_generation_tag_and_extra_variables():
    template = ChatTemplate(
        "{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
        "{{ enable_thinking }}{{ bos_token }}"
    )
    out = template.render([{"content": "x"}, {"content": "y"}], enable_thinking=False)
    assert out == "4xFalse"


def test_qwen3_template_renders_tools_tool_calls_tool_results_and_reasoning(qwen3_template):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "look up",
            "tool_calls": [call],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    out = qwen3_template.render(messages, tools=tools, enable_thinking=False)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(tools[0], ensure_ascii=False) in out
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in out
    assert "<tool_response>\nsunny\n</tool_response>" in out
    assert "<think>\nlook up\n</think>" in out
    assert "<|im_start|>user\nWeather?<|im_end|>" in out
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
