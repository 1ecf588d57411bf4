"""A model's prompts: a conversation through its chat template (tools rendered in its
dialect, the think block opened or closed) into token ids, and raw prompts tokenized as
llama.cpp tokenizes a completion prompt. CPU work only: no engine, no KV."""

from __future__ import annotations

from ..decoding.harmony import is_harmony_template
from ..decoding.reasoning import is_think_template, thinking_prompt_suffix
from ..text.chat_template import ChatTemplate, normalize_messages
from ..text.tokenizer import Tokenizer, TooManyTokens
from ..tools.dialects import dialect_for
from ..tools.prompt import for_template, with_tools


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
    def harmony(self) -> bool:
        """The model writes harmony messages (gpt-oss): the answer is split by channel."""
        return self.architecture == "gpt-oss" or is_harmony_template(self.template.source)

    @property
    def tool_dialect(self):
        """The tool-call dialect this model writes (tool_dialects.dialect_for): BOS is
        added when the template spells `bos_token` or the tokenizer prepends it."""
        adds_bos = self.tokenizer.add_bos or "bos_token" in self.template.source
        return dialect_for(self.model_name, self.architecture, adds_bos, self.harmony)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.prepare_chat(messages)[0]

    def prepare_chat(
        self,
        messages: list[dict],
        enable_thinking: bool = True,
        tools: list | None = None,
        dialect=None,
        reasoning_effort: str | None = None,
    ) -> tuple[list[int], bool]:
        """The prompt ids, and whether the answer starts inside a think block. With a
        think-style template, `enable_thinking` opens the block or prefills a closed one.
        With a tool `dialect`, the tools and the history's tool turns are rendered in it,
        or given to a harmony template, which renders them itself. `reasoning_effort`
        (low, medium, high) is the template's variable of that name, where given."""
        think = self.think_style
        extra: dict = {"enable_thinking": enable_thinking} if think else {}
        if reasoning_effort is not None:
            extra["reasoning_effort"] = reasoning_effort
        if self.harmony:
            messages, extra["tools"] = for_template(messages, tools or [])
        elif dialect is not None:
            messages = with_tools(messages, tools or [], dialect)
        text = self.template.render(
            normalize_messages(messages), add_generation_prompt=True, **extra
        )
        think_open = False
        if think:
            text += thinking_prompt_suffix(text, enable_thinking)
            think_open = enable_thinking
        return self.encode_raw(text), think_open

    def prepare_chat_fitting(
        self,
        messages: list[dict],
        budget: int,
        enable_thinking: bool = True,
        tools: list | None = None,
        dialect=None,
        reasoning_effort: str | None = None,
    ) -> tuple[list[int], bool, int]:
        """prepare_chat with truncation "auto": the oldest turns dropped until the prompt is
        at most `budget` tokens. Kept always: the leading system messages and everything
        from the latest user message on; the turns between go whole, oldest first (an
        assistant's tool calls with their results). Returns (ids, think_open, messages
        dropped). When even the shortest prompt does not fit, the whole conversation's
        prompt with 0 dropped (its refusal is the one "disabled" gets)."""
        head, turns, tail = droppable_turns(messages)

        def attempt(dropped: int) -> tuple[list[int], bool, int] | None:
            kept = [*head, *(m for turn in turns[dropped:] for m in turn), *tail]
            try:
                ids, think_open = self.prepare_chat(
                    kept, enable_thinking, tools, dialect, reasoning_effort
                )
            except TooManyTokens:
                return None
            if len(ids) > budget:
                return None
            return ids, think_open, sum(len(turn) for turn in turns[:dropped])

        fitted = attempt(0)
        if fitted is not None or not turns:
            return fitted or (
                *self.prepare_chat(messages, enable_thinking, tools, dialect, reasoning_effort),
                0,
            )
        # The fewest turns dropped that fit: a longer history never renders shorter.
        low, high = 1, len(turns)
        best = attempt(high)
        if best is None:
            return (
                *self.prepare_chat(messages, enable_thinking, tools, dialect, reasoning_effort),
                0,
            )
        while low < high:
            middle = (low + high) // 2
            trial = attempt(middle)
            if trial is None:
                low = middle + 1
            else:
                best, high = trial, middle
        return best

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


def droppable_turns(messages: list[dict]) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """(the leading system / developer messages, the turns truncation may drop, oldest
    first, and the messages from the latest user message on: at least the last message,
    so something is always left to answer). A turn starts at a user message and holds
    what answers it (assistant messages, tool results), so a tool call never loses its
    result."""
    start = 0
    while start < len(messages) and messages[start].get("role") in ("system", "developer"):
        start += 1
    last_user = max(
        (i for i in range(start, len(messages)) if messages[i].get("role") == "user"),
        default=max(start, len(messages) - 1),
    )
    turns: list[list[dict]] = []
    for message in messages[start:last_user]:
        if not turns or message.get("role") == "user":
            turns.append([])
        turns[-1].append(message)
    return messages[:start], turns, messages[last_user:]
