"""Render a GGUF's `tokenizer.chat_template` the way HF transformers does (jinja2 sandbox)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer import gguf_metadata

# Used when a GGUF carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(jinja2.TemplateError):
    """The template refused the conversation or failed to render it (a client error)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF's override: jinja's own tojson HTML-escapes and sorts keys, which changes prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker) renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                text = part.get("text")
                parts.append(text if isinstance(text, str) else "")
        return "".join(parts)
    return ""


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Copies of `messages` that every template can render: role set, content a string.

    Other keys (tool_calls, reasoning_content, name, tool_call_id ...) are kept as given.
    """
    out = []
    for message in messages:
        m = dict(message)
        m["role"] = m.get("role") or "user"
        m["content"] = _content_text(m.get("content"))
        out.append(m)
    return out


class ChatTemplate:
    """A compiled chat template with the model's bos/eos token texts bound."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"invalid chat template: {e}") from e

    @classmethod
    def from_gguf(cls, source: Any) -> ChatTemplate:
        """The GGUF's own template (ChatML when it has none), with its bos/eos texts."""
        meta = gguf_metadata(source)
        tokens = meta.get("tokenizer.ggml.tokens") or []

        def text_of(key: str) -> str:
            i = meta.get(key)
            return str(tokens[int(i)]) if i is not None and 0 <= int(i) < len(tokens) else ""

        return cls(
            meta.get("tokenizer.chat_template") or CHATML_TEMPLATE,
            bos_token=text_of("tokenizer.ggml.bos_token_id"),
            eos_token=text_of("tokenizer.ggml.eos_token_id"),
        )

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text for `messages`; any template failure is a `ChatTemplateError`."""
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": normalize_messages(messages),
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(str(e) or type(e).__name__) from e
        except (TypeError, ValueError, LookupError, AttributeError) as e:
            # e.g. `None + 'x'` in the template: the conversation does not fit it.
            raise ChatTemplateError(f"chat template failed: {e}") from e
