"""An Anthropic Messages request (POST /v1/messages, /v1/messages/count_tokens) into the
chat core's Turn.

The body is a table of fields (wire/fields.py): the table checks it and is the schema
/openapi.json shows. The conversation is wire/anthropic/conversation.py's. What no
loaded model can honour (images, documents, server tools, an assistant prefill) is a 400
that names the field; nothing is silently dropped but `redacted_thinking` (opaque by
design) and `cache_control` (prefix caching is automatic; see the session id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_TOKENS_CLAMP,
    SamplingParams,
    Turn,
)
from pantheon_platform.errors import ApiError, invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX, MAX_STOP_STRINGS, tool_objects
from wire.anthropic.conversation import MESSAGE, TEXT_BLOCK, conversation
from wire.fields import (
    ANTHROPIC,
    TEXT_MAX,
    Array,
    Boolean,
    Field,
    Integer,
    Number,
    Object,
    Shape,
    String,
    Table,
    Wording,
)

TOOL_CHOICES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("enabled", "disabled", "adaptive")


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages request: the turn fields plus what only the wire format uses."""

    model: str | None
    messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    tool_choice: str | dict
    response_format: dict | None
    enable_thinking: bool | None
    reasoning_budget: int | None
    sampling: SamplingParams
    stream: bool
    session_id: str | None  # the client's id, before it is put in its key's namespace

    def turn(self, session_key: str | None) -> Turn:
        return Turn(
            messages=self.messages,
            tools=self.tools,
            tool_choice=self.tool_choice,
            response_format=self.response_format,
            enable_thinking=self.enable_thinking,
            reasoning_budget=self.reasoning_budget,
            sampling=self.sampling,
            session_id=session_key,
        )


def parse_messages_request(
    data: dict, *, count_only: bool = False, header_session: str | None = None
) -> MessagesRequest:
    """`data` (the body's JSON object) validated into a MessagesRequest; raises the 400
    ApiError naming the field. `count_only`: /v1/messages/count_tokens (no max_tokens,
    no sampling, no stream). The fields are read in the order they always were: the
    first fault found is the one answered."""
    refuse_thread(data.get("thread"))
    model = COUNT.value(data, "model")
    messages = conversation(data.get("messages"), data.get("system"))
    tools = COUNT.value(data, "tools")
    tool_choice = _tool_choice(data.get("tool_choice"), tools)
    enable_thinking, budget = COUNT.value(data, "thinking")
    response_format = COUNT.value(data, "output_config")
    if response_format is None and data.get("output_format") is not None:
        # The older spelling (a beta, still in the SDK's count_tokens).
        response_format = _json_schema_format(data["output_format"], "output_format")
    session_id = COUNT.value(data, "session_id") or header_session or None
    if session_id is not None and len(session_id) > IDENTIFIER_MAX:
        raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
    if count_only:
        sampling = SamplingParams()
        stream = False
    else:
        sampling = _sampling(data)
        stream = REQUEST.value(data, "stream")
        REQUEST.value(data, "metadata")
    return MessagesRequest(
        model=model or None,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=response_format,
        enable_thinking=enable_thinking,
        reasoning_budget=budget,
        sampling=sampling,
        stream=stream,
        session_id=session_id,
    )


def refuse_thread(thread: object) -> None:
    """Message threads (the `thread` field: the server keeps the conversation and a turn
    sends only what is new) are not kept here: a request with one is refused with the
    error code the SDK falls back on (`thread_unsupported_request`: its tool runner then
    sends the whole conversation without `thread`). Answering it as if unthreaded would
    lose the history a `continue` leaves out."""
    if thread is None or thread is False:
        return
    raise ApiError(
        400,
        "thread: this server does not keep message threads; send the whole conversation "
        "without `thread`",
        "invalid_request_error",
        extra={"param": "thread", "details": {"error_code": "thread_unsupported_request"}},
    )


def _sampling(data: dict) -> SamplingParams:
    if data.get("max_tokens") is None:
        raise invalid_request("max_tokens: Field required", "max_tokens")
    max_tokens = REQUEST.value(data, "max_tokens")
    temperature = REQUEST.value(data, "temperature")
    top_p = REQUEST.value(data, "top_p")
    top_k = REQUEST.value(data, "top_k")
    seed = REQUEST.value(data, "seed")
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_tokens=min(max_tokens, MAX_TOKENS_CLAMP),
        stop=REQUEST.value(data, "stop_sequences"),
        seed=seed,
    )


def _stop_sequences(value: object, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_request("stop_sequences: expected an array of strings", "stop_sequences")
    if len(value) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"stop_sequences: at most {MAX_STOP_STRINGS} sequences", "stop_sequences"
        )
    if any(len(s) > IDENTIFIER_MAX for s in value):
        raise invalid_request(
            f"stop_sequences: a sequence may have at most {IDENTIFIER_MAX} characters",
            "stop_sequences",
        )
    return tuple(s for s in value if s)


def _thinking(value: dict, path: str) -> tuple[bool | None, int | None]:
    """(enable_thinking, reasoning_budget): absent -> the server's defaults (as the chat
    route); `enabled` with `budget_tokens` -> thinking within that budget; `adaptive` ->
    thinking within the model's budget; `disabled` -> no thinking."""
    kind = value.get("type")
    if kind not in THINKING_TYPES:
        raise invalid_request(
            f"thinking.type: expected one of {', '.join(THINKING_TYPES)}", "thinking.type"
        )
    if kind == "disabled":
        return False, None
    if kind == "adaptive":
        return True, None
    if value.get("budget_tokens") is None:
        raise invalid_request("thinking.budget_tokens: Field required", "thinking.budget_tokens")
    return True, THINKING.value(value, "budget_tokens", "thinking.")


def _output_format(value: dict, path: str) -> dict | None:
    """`output_config.format` (structured outputs: a JSON schema) as the core's
    response_format; `output_config.effort` is accepted and not used."""
    fmt = value.get("format")
    if fmt is None:
        return None
    return _json_schema_format(fmt, "output_config.format")


def _json_schema_format(fmt: object, path: str) -> dict:
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise invalid_request(f'{path}: expected {{"type": "json_schema", "schema": ...}}', path)
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request(f"{path}.schema: expected an object", f"{path}.schema")
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


# --- tools ---------------------------------------------------------------------------


def _tools(value: object, path: str) -> tuple[dict, ...]:
    """Custom (client) tools as OpenAI function tools. Anthropic's server tools (web
    search, code execution, bash, ...) run on Anthropic's side: refused."""
    out = []
    for where, tool in tool_objects(value):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise invalid_request(
                f"{where}.type: {json.dumps(kind)} is not supported: only custom tools "
                "(name, description, input_schema) run here, none of Anthropic's server tools",
                f"{where}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"{where}.name: expected a string", f"{where}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid_request(
                f"{where}.input_schema: expected a JSON schema object", f"{where}.input_schema"
            )
        function: dict = {"name": name, "parameters": schema}
        description = TOOL.value(tool, "description", f"{where}.")
        if description is not None:
            function["description"] = description
        out.append({"type": "function", "function": function})
    return tuple(out)


def _tool_choice(value: object, tools: tuple[dict, ...]) -> str | dict:
    """auto -> "auto", any -> "required", tool -> that function, none -> "none"."""
    if value is None:
        return "auto"
    if not isinstance(value, dict) or value.get("type") not in TOOL_CHOICES:
        raise invalid_request(
            'tool_choice: expected {"type": "auto" | "any" | "tool" | "none"}', "tool_choice"
        )
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_request(
            "tool_choice.disable_parallel_tool_use: expected a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    kind = value["type"]
    if kind in ("any", "tool") and not tools:
        raise invalid_request(
            f'tool_choice: "{kind}" needs `tools` (none were offered)', "tool_choice"
        )
    if kind == "any":
        return "required"
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise invalid_request(
                "tool_choice.name: expected the name of a tool in `tools`", "tool_choice.name"
            )
        return {"type": "function", "function": {"name": name}}
    return kind


# --- the tables ----------------------------------------------------------------------

_STRING = String()
_IDENT = String(IDENTIFIER_MAX)
_OBJECT = Shape({"type": "object"})


def _member(name: str, kind, required: bool = False, description: str | None = None) -> Field:
    """A member of a nested object (never null there)."""
    return Field(name, kind, required=required, nullable=False, description=description)


# Anthropic words what a nested field holds without naming the kind that came.
_NESTED = Wording(says_kind=False)
TOOL = Table(
    _member("type", Shape({"const": "custom"})),
    _member("name", String(min_length=1), True),
    _member("description", String(TEXT_MAX)),  # bounded like the texts (wire/fields.py)
    _member("input_schema", _OBJECT, True),
    wording=_NESTED,
)
TOOL_CHOICE = Table(
    _member("type", Shape({"enum": list(TOOL_CHOICES)}), True),
    _member("name", _IDENT),  # the name of a tool in `tools`
    _member("disable_parallel_tool_use", Boolean()),
)
THINKING = Table(
    _member("type", Shape({"enum": list(THINKING_TYPES)}), True),
    _member("budget_tokens", Integer(low=1)),
    wording=ANTHROPIC,
)
OUTPUT_CONFIG = Table(
    Field(
        "format",
        Shape(
            Table(
                _member("type", Shape({"const": "json_schema"}), True),
                _member("schema", _OBJECT, True),
            ).schema()
        ),
    ),
    _member("effort", Shape({}), description="Accepted, not used."),
)
METADATA = Table(Field("user_id", _IDENT), wording=_NESTED)

# /v1/messages/count_tokens' body; /v1/messages' adds sampling (REQUEST).
COUNT = Table(
    Field("model", _IDENT),
    _member(
        "messages",
        Array(
            MESSAGE.schema(
                description="The last message must be the user's (an assistant prefill is a 400)."
            ),
            "PANTHEON_MAX_MESSAGES",
            min_items=1,
        ),
        True,
    ),
    _member(
        "system",
        Shape(
            {
                "anyOf": [
                    _STRING.schema(),
                    Array(TEXT_BLOCK.schema()).schema(),
                    {"type": "null"},
                ]
            }
        ),
    ),
    Field(
        "tools",
        Array(
            TOOL.schema(
                additionalProperties=True,
                description="Custom tools only: Anthropic's server tools (web search, "
                "bash, ...) are a 400.",
            ),
            "PANTHEON_MAX_TOOLS",
            reader=_tools,
        ),
        default=(),
    ),
    Field(
        "tool_choice",
        Shape(TOOL_CHOICE.schema()),
        description="any: a call is compelled; tool: that tool is (name required); "
        "any and tool need `tools`.",
    ),
    Field(
        "thinking",
        Object(THINKING, additional=True, reader=_thinking),
        description="enabled (budget_tokens required): think, the block closed after that "
        "many tokens; adaptive: think within the model's budget; disabled: no thinking. "
        "Absent: the server's default. Only think-style templates think.",
        default=(None, None),
    ),
    Field(
        "output_config",
        Object(OUTPUT_CONFIG, additional=True, reader=_output_format),
        description="format: the answer is held to this JSON schema.",
    ),
    Field(
        "session_id",
        _IDENT,
        description="Extension: the prefix-cache session (else X-Session-Id).",
    ),
    wording=ANTHROPIC,
)
REQUEST = COUNT + Table(
    _member("max_tokens", Integer(low=1), True),
    Field("temperature", Number(0, 1), default=DEFAULT_TEMPERATURE),
    Field("top_p", Number(0, 1), default=DEFAULT_TOP_P),
    Field(
        "top_k",
        Integer(0, (1 << 31) - 1, out_of_range="must be between 0 and 2**31 - 1"),
        default=DEFAULT_TOP_K,
    ),
    Field(
        "stop_sequences",
        Array(_IDENT, MAX_STOP_STRINGS, reader=_stop_sequences),
        default=(),
    ),
    Field("stream", Boolean(), default=False),
    Field("metadata", Object(METADATA, additional=True)),
    Field("seed", Integer(), description="Extension: the sampler's seed."),
)
