"""POST /v1/responses: the request's JSON checked and turned into chat-core terms.

The body is a table of fields (wire/fields.py): the table checks it and is the schema
/openapi.json shows. The Responses shapes map onto the neutral chat shape
(engine.chat.Turn): `input` items become messages (wire/responses/conversation.py),
`instructions` a leading system message, flat function tools the chat tool shape,
`text.format` a response_format, `reasoning.effort` thinking on or off with a reasoning
budget. Every refusal is a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from engine import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_TOKENS_CLAMP,
    SamplingParams,
)
from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX, SPECULATION_MODES, TRUNCATION_MODES
from wire.fields import (
    EFFORT_BUDGETS,
    RESPONSES,
    TEXT_MAX,
    AnyOf,
    Array,
    Boolean,
    Field,
    Integer,
    Number,
    Object,
    Shape,
    String,
    Table,
    effort_thinking,
)
from wire.responses.conversation import ITEMS, input_messages

TEMPERATURE_MAX = 2.0  # OpenAI's range for this route: [0, 2]
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX = 64
METADATA_VALUE_MAX = 512
# Accepted and not acted on: they change nothing a local model does.
IGNORED = (
    "include",
    "user",
    "safety_identifier",
    "service_tier",
    "stream_options",
    "prompt_cache_retention",
    "max_tool_calls",
)
REFUSED = {
    "background": "background responses are not supported; send the request without it",
    "conversation": "conversations are not supported; continue with previous_response_id",
    "prompt": "prompt templates are not supported; send `input` and `instructions`",
}
TOOL_CHOICES = ("auto", "none", "required")
VERBOSITY = ("low", "medium", "high")
SUMMARIES = ("auto", "concise", "detailed")
FORMAT_NAME_MAX = 64  # text.format.name
TOOL_NAME_MAX = 64  # as the chat core's tool names (1-64 of [A-Za-z0-9_.-])
_FUNCTION_TOOL = "A function tool (Responses' flat shape). Other tool types are 400."


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked POST /v1/responses body, in chat-core terms plus what the response
    object echoes back."""

    model: str | None
    input_messages: tuple[dict, ...]  # this request's input, as chat messages
    instructions: str | None
    tools: tuple[dict, ...]  # chat shape, for the core
    tools_echo: tuple[dict, ...]  # Responses shape, for the response object
    tool_choice: str | dict  # chat shape
    tool_choice_echo: str | dict  # Responses shape
    response_format: dict | None
    text_echo: dict
    enable_thinking: bool | None
    reasoning_budget: int | None
    reasoning_echo: dict
    temperature: float
    top_p: float
    max_output_tokens: int | None
    seed: int | None
    store: bool
    stream: bool
    previous_response_id: str | None
    metadata: dict
    parallel_tool_calls: bool
    session_id: str | None  # prompt_cache_key (or the session_id extension)
    top_logprobs: int = 0
    speculation: str | None = None  # the extension: "auto" | "off"; None: the model's
    truncation: str = "disabled"  # "auto": the oldest turns dropped to fit the window

    def sampling(self) -> SamplingParams:
        max_tokens = DEFAULT_MAX_TOKENS
        if self.max_output_tokens is not None:
            max_tokens = min(self.max_output_tokens, MAX_TOKENS_CLAMP)
        return SamplingParams(
            temperature=self.temperature,
            top_k=DEFAULT_TOP_K,
            top_p=self.top_p,
            max_tokens=max_tokens,
            seed=self.seed,
            logprobs=self.top_logprobs > 0,
            top_logprobs=self.top_logprobs,
        )


def parse_request(body: dict) -> ResponsesRequest:
    """The checked request, or a 400 (invalid_request_error) naming the field. The
    fields are read in the order they always were: the first fault is the one answered."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise invalid_request(f"{name}: {why}", param=name)
    model = REQUEST.value(body, "model") or None
    instructions = REQUEST.value(body, "instructions")
    tools_echo, tools = REQUEST.value(body, "tools")
    tool_choice_echo, tool_choice = _tool_choice(body.get("tool_choice"), tools_echo)
    text_echo, response_format = REQUEST.value(body, "text") or (
        {"format": {"type": "text"}},
        None,
    )
    reasoning_echo, enable_thinking, budget = REQUEST.value(body, "reasoning") or (
        {"effort": None, "summary": None},
        None,
        None,
    )
    temperature = REQUEST.value(body, "temperature")
    top_p = REQUEST.value(body, "top_p")
    max_output_tokens = REQUEST.value(body, "max_output_tokens")
    top_logprobs = REQUEST.value(body, "top_logprobs")
    previous = REQUEST.value(body, "previous_response_id")
    # session_id (the extension) is read only when prompt_cache_key names none.
    session_id = REQUEST.value(body, "prompt_cache_key") or REQUEST.value(body, "session_id")
    messages = input_messages(body.get("input"), allow_empty=bool(previous))
    return ResponsesRequest(
        model=model,
        input_messages=tuple(messages),
        instructions=instructions,
        tools=tuple(tools),
        tools_echo=tuple(tools_echo),
        tool_choice=tool_choice,
        tool_choice_echo=tool_choice_echo,
        response_format=response_format,
        text_echo=text_echo,
        enable_thinking=enable_thinking,
        reasoning_budget=budget,
        reasoning_echo=reasoning_echo,
        temperature=temperature,
        top_p=top_p,
        max_output_tokens=max_output_tokens,
        seed=REQUEST.value(body, "seed"),
        store=REQUEST.value(body, "store"),
        stream=REQUEST.value(body, "stream"),
        previous_response_id=previous or None,
        metadata=REQUEST.value(body, "metadata") or {},
        parallel_tool_calls=REQUEST.value(body, "parallel_tool_calls"),
        session_id=session_id or None,
        top_logprobs=top_logprobs,
        speculation=REQUEST.value(body, "speculation"),
        truncation=REQUEST.value(body, "truncation") or "disabled",
    )


# --- tools -----------------------------------------------------------------------------


def _tools(value: object, path: str) -> tuple[list[dict], list[dict]]:
    """(the tools as the response echoes them, the tools in the chat shape)."""
    if not isinstance(value, list):
        raise invalid_request("tools: expected a list of tools", param="tools")
    limit = settings.PANTHEON_MAX_TOOLS
    if len(value) > limit:
        raise invalid_request(
            f"tools: at most {limit} tools (PANTHEON_MAX_TOOLS); got {len(value)}", param="tools"
        )
    echo, chat = [], []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_request(f"{where}: expected an object", param=where)
        kind = tool.get("type")
        if kind != "function":
            raise invalid_request(
                f"{where}.type: {kind!r} tools are not supported; only function tools "
                "(the caller runs them) are",
                param=f"{where}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(
                f"{where}.name: expected a non-empty string", param=f"{where}.name"
            )
        if len(name) > TOOL_NAME_MAX:
            raise invalid_request(
                f"{where}.name: at most {TOOL_NAME_MAX} characters", param=f"{where}.name"
            )
        description = FUNCTION_TOOL.value(tool, "description", f"{where}.")
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid_request(
                f"{where}.parameters: expected a JSON schema object", param=f"{where}.parameters"
            )
        strict = FUNCTION_TOOL.value(tool, "strict", f"{where}.")
        function: dict = {"name": name}
        if description is not None:
            function["description"] = description
        function["parameters"] = parameters if parameters is not None else {"type": "object"}
        if strict is not None:
            function["strict"] = strict
        chat.append({"type": "function", "function": function})
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": True if strict is None else strict,
            }
        )
    return echo, chat


def _tool_choice(value: object, tools: list[dict]) -> tuple[str | dict, str | dict]:
    """(tool_choice as the response echoes it, in the chat shape)."""
    if value is None:
        return "auto", "auto"
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise invalid_request(
                'tool_choice: expected "auto", "none", "required" or '
                '{"type": "function", "name": ...}',
                param="tool_choice",
            )
        if value == "required" and not tools:
            raise invalid_request(
                'tool_choice: "required" needs `tools` to call; none were given',
                param="tool_choice",
            )
        return value, value
    if not isinstance(value, dict):
        raise invalid_request("tool_choice: expected a string or an object", param="tool_choice")
    kind = value.get("type")
    if kind != "function":
        raise invalid_request(
            f"tool_choice.type: {kind!r} is not supported; name a function "
            '({"type": "function", "name": ...}) or use "auto", "none", "required"',
            param="tool_choice.type",
        )
    name = value.get("name")
    if not isinstance(name, str) or name not in {t["name"] for t in tools}:
        raise invalid_request(
            "tool_choice.name: expected the name of a function in `tools`",
            param="tool_choice.name",
        )
    return {"type": "function", "name": name}, {"type": "function", "function": {"name": name}}


# --- text, reasoning ------------------------------------------------------------------


def _text(value: dict, path: str) -> tuple[dict, dict | None]:
    """(text as the response echoes it, the chat response_format or None)."""
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise invalid_request(
            'text.verbosity: expected "low", "medium" or "high"', param="text.verbosity"
        )
    fmt = value.get("format")
    echo: dict = {}
    if verbosity is not None:
        echo["verbosity"] = verbosity
    if fmt is None:
        echo["format"] = {"type": "text"}
        return echo, None
    if not isinstance(fmt, dict):
        raise invalid_request("text.format: expected an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        echo["format"] = {"type": "text"}
        return echo, None
    if kind == "json_object":
        echo["format"] = {"type": "json_object"}
        return echo, {"type": "json_object"}
    if kind != "json_schema":
        raise invalid_request(
            'text.format.type: expected "text", "json_object" or "json_schema"',
            param="text.format.type",
        )
    name = fmt.get("name")
    if not isinstance(name, str) or not name or len(name) > FORMAT_NAME_MAX:
        raise invalid_request(
            f"text.format.name: expected a non-empty string (at most {FORMAT_NAME_MAX} characters)",
            param="text.format.name",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request(
            "text.format.schema: expected a JSON schema object", param="text.format.schema"
        )
    strict = JSON_SCHEMA_FORMAT.value(fmt, "strict", "text.format.")
    description = JSON_SCHEMA_FORMAT.value(fmt, "description", "text.format.")
    json_schema: dict = {"name": name, "schema": schema}
    if strict is not None:
        json_schema["strict"] = strict
    if description is not None:
        json_schema["description"] = description
    echo["format"] = {"type": "json_schema", **json_schema}
    return echo, {"type": "json_schema", "json_schema": json_schema}


def _reasoning(value: dict, path: str) -> tuple[dict, bool | None, int | None]:
    """(reasoning as the response echoes it, enable_thinking, reasoning budget); a
    null effort leaves thinking to the server's default."""
    effort = value.get("effort")
    summary = value.get("summary")
    if summary is not None and summary not in SUMMARIES:
        raise invalid_request(
            'reasoning.summary: expected "auto", "concise" or "detailed"',
            param="reasoning.summary",
        )
    echo = {"effort": effort, "summary": summary}
    if effort is None:
        return echo, None, None
    if effort not in EFFORT_BUDGETS:
        raise invalid_request(
            f"reasoning.effort: expected one of {', '.join(EFFORT_BUDGETS)}",
            param="reasoning.effort",
        )
    return echo, *effort_thinking(effort)


def _speculation(value: object, path: str) -> str:
    if value not in SPECULATION_MODES:
        raise invalid_request(f'{path}: expected "auto" or "off"', param=path)
    return value


def _truncation(value: object, path: str) -> str:
    if value not in TRUNCATION_MODES:
        raise invalid_request(f'{path}: expected "auto" or "disabled"', param=path)
    return value


def _metadata(value: object, path: str) -> dict:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values 512."""
    if not isinstance(value, dict):
        raise invalid_request("metadata: expected an object of strings", param="metadata")
    if len(value) > METADATA_MAX_PAIRS:
        raise invalid_request(
            f"metadata: at most {METADATA_MAX_PAIRS} pairs; got {len(value)}", param="metadata"
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_MAX:
            raise invalid_request(
                f"metadata: keys have at most {METADATA_KEY_MAX} characters", param="metadata"
            )
        if not isinstance(item, str) or len(item) > METADATA_VALUE_MAX:
            raise invalid_request(
                f"metadata.{key}: expected a string of at most {METADATA_VALUE_MAX} characters",
                param=f"metadata.{key}",
            )
    return dict(value)


# --- the table -------------------------------------------------------------------------

_STRING = String(TEXT_MAX)  # every free-form text, as the conversation's (conversation.py)
_IDENT = String(IDENTIFIER_MAX)
_OBJECT = Shape({"type": "object"})


def _member(name: str, kind, required: bool = False) -> Field:
    """A member of a nested object (never null there)."""
    return Field(name, kind, required=required, nullable=False)


FUNCTION_TOOL = Table(
    _member("type", Shape({"const": "function"}), True),
    _member("name", String(TOOL_NAME_MAX, min_length=1), True),
    Field("description", _STRING),
    Field("parameters", _OBJECT),
    Field("strict", Boolean()),
    wording=RESPONSES,
)
JSON_SCHEMA_FORMAT = Table(
    _member("type", Shape({"const": "json_schema"}), True),
    _member("name", String(FORMAT_NAME_MAX, min_length=1), True),
    _member("schema", _OBJECT, True),
    Field("strict", Boolean()),
    Field("description", _STRING),
    wording=RESPONSES,
)
TEXT = Table(
    Field(
        "format",
        AnyOf(
            (
                Table(_member("type", Shape({"enum": ["text", "json_object"]}), True)).schema(),
                JSON_SCHEMA_FORMAT.schema(),
            )
        ),
    ),
    Field("verbosity", Shape({"enum": list(VERBOSITY)})),
)
REASONING = Table(
    Field(
        "effort",
        Shape({"enum": list(EFFORT_BUDGETS)}),
        description="none/minimal: no thinking; low 512, medium 2048, high 8192, xhigh "
        "16384 reasoning tokens; max: no budget (think-style templates only).",
    ),
    Field("summary", Shape({"enum": list(SUMMARIES)})),
)
_METADATA = {
    "type": "object",
    "maxProperties": METADATA_MAX_PAIRS,
    "propertyNames": {"maxLength": METADATA_KEY_MAX},
    "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_MAX},
}
REQUEST = Table(
    Field("model", _IDENT, description="Served name or alias; with one model any value."),
    Field(
        "input",
        AnyOf((_STRING, Array(ITEMS, "PANTHEON_MAX_MESSAGES"))),
        nullable=False,
        description="Required unless previous_response_id is given.",
    ),
    Field("instructions", _STRING, description="A system message; not carried over."),
    Field(
        "tools",
        Array(
            FUNCTION_TOOL.schema(description=_FUNCTION_TOOL), "PANTHEON_MAX_TOOLS", reader=_tools
        ),
        default=((), ()),
    ),
    Field(
        "tool_choice",
        AnyOf(
            (
                {"enum": list(TOOL_CHOICES)},
                Table(
                    _member("type", Shape({"const": "function"}), True),
                    _member("name", _IDENT, True),
                ).schema(),
            )
        ),
    ),
    Field("text", Object(TEXT, reader=_text)),
    Field("reasoning", Object(REASONING, reader=_reasoning)),
    Field("temperature", Number(0, TEMPERATURE_MAX), default=DEFAULT_TEMPERATURE),
    Field("top_p", Number(0, 1), default=DEFAULT_TOP_P),
    Field("max_output_tokens", Integer(low=1), description="Default 1024."),
    Field("top_logprobs", Integer(0, 20), default=0),
    Field("seed", Integer()),
    Field("store", Boolean(), description="Default true.", default=True),
    Field("stream", Boolean(), default=False),
    Field("parallel_tool_calls", Boolean(), default=True),
    Field("previous_response_id", _IDENT),
    Field("prompt_cache_key", _IDENT, description="The session id (prefix cache) to run under."),
    Field("session_id", _IDENT),
    Field(
        "speculation",
        Shape({"enum": list(SPECULATION_MODES)}, _speculation),
        description='Extension: "auto" (the default) lets the engine draft tokens and '
        "verify them in one pass where the server allows it (PANTHEON_SPECULATION); "
        '"off" never drafts. The output is the same either way.',
    ),
    Field(
        "truncation",
        Shape({"enum": list(TRUNCATION_MODES)}, _truncation),
        description='"disabled" (the default) refuses an input past the context window; '
        '"auto" drops the oldest turns (never the instructions or the latest user message '
        "on) to fit, leaving the answer max_output_tokens (at most a quarter of the "
        "window); usage.truncated_messages says how many messages went.",
    ),
    Field("metadata", Shape(_METADATA, _metadata)),
    Field("background", Shape({"const": False})),
    wording=RESPONSES,
)
