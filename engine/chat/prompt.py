"""A model's prompts: a conversation through its chat template (tools rendered in its
dialect, the think block opened or closed) into token ids, and raw prompts tokenized as
llama.cpp tokenizes a completion prompt. CPU work only: no engine, no KV."""

from __future__ import annotations

from ..decoding.reasoning import is_think_template, thinking_prompt_suffix
from ..text.chat_template import ChatTemplate, normalize_messages
from ..text.tokenizer import Tokenizer
from ..tools.dialects import dialect_for
from ..tools.prompt import with_tools


class PromptBuilder:
    def __init__(
        self,
        model_name: str,
        architecture: str,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        context_window: int,
    ):
        self.model_name = model_name
        self.architecture = architecture
        self.tokenizer = tokenizer
        self.template = template
        # A text certain to overflow this many tokens is refused untokenized.
        self.context_window = context_window

    @property
    def think_style(self) -> bool:
        """The chat template knows `<think>` blocks (reasoning is split from the answer)."""
        return is_think_template(self.template.source)

    @property
    def tool_dialect(self):
        """The tool-call dialect this model writes (tool_dialects.dialect_for): BOS is
        added when the template spells `bos_token` or the tokenizer prepends it."""
        adds_bos = self.tokenizer.add_bos or "bos_token" in self.template.source
        return dialect_for(self.model_name, self.architecture, adds_bos)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.prepare_chat(messages)[0]

    def prepare_chat(
        self,
        messages: list[dict],
        enable_thinking: bool = True,
        tools: list | None = None,
        dialect=None,
    ) -> tuple[list[int], bool]:
        """The prompt ids, and whether the answer starts inside a think block. With a
        think-style template, `enable_thinking` opens the block or prefills a closed one.
        With a tool `dialect`, the tools and the history's tool turns are rendered in it."""
        if dialect is not None:
            messages = with_tools(messages, tools or [], dialect)
        think = self.think_style
        extra = {"enable_thinking": enable_thinking} if think else {}
        text = self.template.render(
            normalize_messages(messages), add_generation_prompt=True, **extra
        )
        think_open = False
        if think:
            text += thinking_prompt_suffix(text, enable_thinking)
            think_open = enable_thinking
        return self.encode_raw(text), think_open

    def encode_raw(self, text: str) -> list[int]:
        """A raw prompt's ids (no chat template): special tokens written in it recognised,
        BOS where the GGUF adds one. TooManyTokens when certain not to fit the window."""
        # A text certain to overflow the configured window is refused untokenized
        # (Tokenizer.TooManyTokens): a huge prompt costs no tokenizer time.
        ids = self.tokenizer.encode(text, limit=self.context_window)
        bos = self.tokenizer.bos_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids
