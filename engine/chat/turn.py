"""A chat turn as every wire format hands it to the core: built once, frozen.

The messages are in the neutral form (the OpenAI chat message shape): role `system` /
`user` / `assistant` / `tool`, string `content`; an assistant turn may carry
`tool_calls` ([{id, type: "function", function: {name, arguments: JSON text}}]) and
`reasoning_content`; a tool turn its `tool_call_id`. Tools are OpenAI function tools
({"type": "function", "function": {name, description, parameters}}).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import SamplingParams


@dataclass(frozen=True)
class Turn:
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = ()
    # "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: str | dict = "auto"
    response_format: dict | None = None  # OpenAI response_format JSON; None: plain text
    enable_thinking: bool | None = None  # None: the server's default (ChatOptions.no_think)
    reasoning_budget: int | None = None  # None: the model's configured budget
    # The API's reasoning effort ("none" .. "max"), given to a template that reads
    # `reasoning_effort` (gpt-oss's harmony: "Reasoning: low|medium|high") as
    # template_effort spells it; None: the template's default.
    reasoning_effort: str | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1  # choices wanted; the core asks the engine for at most MAX_CHOICES
    # Prefix-cache key, already in the caller's key's namespace (sessions.tenancy).
    session_id: str | None = None
    session_implicit: bool = False  # the server chose session_id (GenerationRequest's)
    # Whose prompts may share the prefix cache: the caller's key's namespace ("" open).
    cache_namespace: str = ""
    priority: str = "interactive"  # the engine's class: "interactive" or "batch"
    logprobs: bool = False  # the client wants per-token logprobs rendered
    request_id: str = ""  # the engine's id for this request; "" -> one is made up
    # A raw prompt (legacy /v1/completions, Ollama's `raw`): no chat template, no tools,
    # no think block. A string is tokenized as llama.cpp tokenizes a completion prompt
    # (special tokens written in it recognised, BOS where the GGUF adds one); token ids
    # are taken as sent. `messages` is then unused.
    raw_prompt: str | tuple[int, ...] | None = None
    # OpenAI Predicted Outputs: the text the client expects the answer to be (drafted
    # from by speculative decoding; it never changes the answer). None: none.
    prediction: str | None = None
    # "auto" | "off": whether the engine may draft tokens; None: the model's default.
    speculation: str | None = None
    # Context overflow: "disabled" refuses a prompt past the window (ContextOverBudget);
    # "auto" drops the oldest turns to fit (PromptBuilder.prepare_chat_fitting) and says
    # how many messages went in usage.truncated_messages.
    truncation: str = "disabled"


# The API's effort levels (OpenAI's chat and Responses, Ollama's think levels) as a
# template's `reasoning_effort` takes them: harmony knows low, medium and high.
TEMPLATE_EFFORTS = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def template_effort(effort: str | None) -> str | None:
    """The template's spelling of an API effort level; None stays None."""
    return None if effort is None else TEMPLATE_EFFORTS[effort]


@dataclass(frozen=True)
class ChatOptions:
    """Server settings that shape a turn, passed in by the caller (the engine reads no
    settings): PANTHEON_NO_THINK and PANTHEON_TOOL_GRAMMAR."""

    no_think: bool = False  # a turn that leaves enable_thinking unset does not think
    # None (unset): a grammar compels "required" and named calls; True: also masks an
    # "auto" call once it opens; False: no tool grammar at all.
    tool_grammar: bool | None = None


class InvalidTurn(ValueError):
    """A turn the core refuses (a bad tool or tool_choice, a response_format that does
    not compile, a conversation the chat template refuses). `param`: the field at fault,
    when one is named. Wire formats answer it as their 400."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
