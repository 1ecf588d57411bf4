"""Ollama requests (POST /api/chat, /api/generate, /api/embed, /api/show) into the chat
core's Turn.

Each body is a table of fields (wire/fields.py): the table checks it and is the schema
/openapi.json shows. `options` map onto our sampling; unknown options are ignored (as
Ollama ignores them), known ones of the wrong type are a 400 naming the option. Unset
options take this server's defaults (those of /v1/chat/completions), not an Ollama
Modelfile's. The conversation itself is wire/ollama/conversation.py's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from engine import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_TOKENS_CLAMP,
    SamplingParams,
    Turn,
)
from pantheon_platform.durations import DURATION_MAX_CHARS, parse_duration
from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    MAX_STOP_STRINGS,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    json_kind,
)
from wire.fields import (
    OLLAMA,
    Array,
    Boolean,
    Field,
    Integer,
    Number,
    Object,
    Shape,
    String,
    Table,
    stop_strings,
)
from wire.ollama.conversation import MESSAGE, TOOL, conversation, refuse_images, tools

THINK_LEVELS = ("high", "medium", "low")  # Ollama's levels: any of them turns thinking on
# Ollama's duration strings (Go's time.ParseDuration): "5m", "1h30m", "-1s", "0.5h". The
# pattern is for the OpenAPI document only: requests are read by parse_duration, a linear
# scan (a backtracking regex on a client's string froze the process: durations.py).
DURATION_PATTERN = (
    r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))*\s*$"
)
LATEST = ":latest"
MAX_EMBED_INPUTS = 2048  # as /v1/embeddings


@dataclass(frozen=True)
class OllamaRequest:
    """A validated /api/chat or /api/generate request: the turn's fields, plus what only
    the wire format uses."""

    model: str
    messages: tuple[dict, ...]  # empty: Ollama's "load the model" request
    tools: tuple[dict, ...]
    response_format: dict | None
    enable_thinking: bool | None
    sampling: SamplingParams
    stream: bool
    num_ctx: int | None  # checked against the served window once the model is known
    logprobs: bool
    session_id: str | None  # X-Session-Id, before it is put in its key's namespace
    keep_alive: object = None  # the session's idle TTL (keep_alive_seconds); README "Ollama API"
    raw_prompt: str | None = None  # /api/generate with raw: the prompt as is, no template
    reasoning_effort: str | None = None  # `think` given as a level (gpt-oss's template reads it)

    def turn(self, request_id: str) -> Turn:
        return Turn(
            messages=self.messages,
            tools=self.tools,
            response_format=self.response_format,
            enable_thinking=self.enable_thinking,
            reasoning_effort=self.reasoning_effort,
            sampling=self.sampling,
            logprobs=self.logprobs,
            request_id=request_id,
            raw_prompt=self.raw_prompt,
        )


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    inputs: list[str]
    truncate: bool  # an input over the window is cut to it (Ollama's default), else a 400
    dimensions: int | None


# --- the fields a table cannot read alone ----------------------------------------------


def _keep_alive(value: object, path: str) -> object:
    """A number of seconds or a Go duration string ("5m", "-1", "0"). Models stay loaded
    as the operator loaded them; with a session (X-Session-Id) it is that conversation's
    idle TTL in the session cache (README, "Ollama API")."""
    if not isinstance(value, str):
        return Number().read(value, path, OLLAMA)
    if len(value) > DURATION_MAX_CHARS:
        raise invalid_request(f"{path}: at most {DURATION_MAX_CHARS} characters", path)
    if parse_duration(value) is None:
        raise invalid_request(
            f'{path}: {json.dumps(value)} is not a duration (e.g. "5m", "1h", '
            '"-1", or a number of seconds)',
            path,
        )
    return value


def keep_alive_seconds(value: object) -> float | None:
    """A validated keep_alive in seconds: a number is seconds, a string a Go duration
    (a bare number in a string is seconds too, as Ollama reads "-1"); negative: forever
    (math.inf). None when absent."""
    if value is None:
        return None
    seconds = parse_duration(value) if isinstance(value, str) else float(value)
    if seconds is None:
        raise ValueError(f"not a duration: {value[:DURATION_MAX_CHARS]!r}")
    return math.inf if seconds < 0 else seconds


def _response_format(value: object, path: str) -> dict | None:
    """`format`: "json" -> a JSON object; a JSON schema object -> that schema (both
    enforced by the grammar); "" or absent -> plain text."""
    if value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": value, "strict": True},
        }
    raise invalid_request(
        f'{path}: expected "json" or a JSON schema object, got {json.dumps(value)[:80]}', path
    )


def _think(value: object, path: str) -> bool:
    """`think`: true/false, or a level ("high", "medium", "low": thinking on; the level
    is not a budget here, but a template that reads `reasoning_effort`, gpt-oss's, gets
    it). Absent: the server's default."""
    if isinstance(value, bool):
        return value
    if value in THINK_LEVELS:
        return True
    raise invalid_request(
        f'{path}: expected true, false, "high", "medium" or "low", got {json.dumps(value)[:80]}',
        path,
    )


# --- the tables ----------------------------------------------------------------------

_STRING = String()
_IDENT = String(IDENTIFIER_MAX)
# Whole numbers: the document has always shown these bounds as integers.
_TEMPERATURE = Number(*(int(bound) for bound in TEMPERATURE_RANGE))
_REPEAT_MAX = int(REPETITION_PENALTY_MAX)

# Sampling options, in the order they are checked.
OPTIONS = Table(
    Field("num_predict", Integer(), description="<= 0: the default, 1024."),
    Field("top_k", Integer(-(1 << 31), (1 << 31) - 1, out_of_range="must fit in 32 bits")),
    Field(
        "repeat_penalty",
        Number(
            above=0,
            high=_REPEAT_MAX,
            out_of_range=f"must be above 0 and at most {REPETITION_PENALTY_MAX:g} (1 disables it)",
        ),
        default=1.0,
    ),
    Field("temperature", _TEMPERATURE, default=DEFAULT_TEMPERATURE),
    Field("top_p", Number(0, 1), default=DEFAULT_TOP_P),
    Field(
        "stop",
        Shape(
            {
                "anyOf": [
                    _IDENT.schema(),
                    Array(_IDENT, max_items=MAX_STOP_STRINGS).schema(),
                ]
            },
            stop_strings,
        ),
        default=(),
    ),
    Field("seed", Integer()),
    Field("presence_penalty", Number(), default=0.0),
    Field("frequency_penalty", Number(), default=0.0),
    Field("min_p", Number(0, 1), default=0.0),
    Field(
        "num_ctx",
        Integer(low=1),
        description="Above the served window: a 400 (not truncated).",
    ),
    wording=OLLAMA,
)
# `model` is read by model_name (its old spelling `name` stands in for it).
MODEL = Field("model", String(IDENTIFIER_MAX, min_length=1), required=True, nullable=False)
_OPTIONS = Field(
    "options",
    Object(OPTIONS, additional=True, nested=False),
    description="Sampling options; unknown ones are ignored (as Ollama does).",
)
_KEEP_ALIVE = Field(
    "keep_alive",
    Shape(
        {
            "anyOf": [
                Number().schema(),
                {"type": "string", "maxLength": DURATION_MAX_CHARS, "pattern": DURATION_PATTERN},
            ]
        },
        _keep_alive,
    ),
    description='Seconds or a duration ("5m", "-1"): accepted; models stay '
    "loaded as the operator loaded them.",
)
COMMON = Table(
    MODEL,
    Field("stream", Boolean(), description="Default true: NDJSON lines."),
    Field(
        "format",
        Shape({"anyOf": [{"enum": ["", "json"]}, {"type": "object"}]}, _response_format),
        description='A JSON schema, or "json".',
    ),
    _OPTIONS,
    _KEEP_ALIVE,
    Field("think", Shape({"anyOf": [Boolean().schema(), {"enum": list(THINK_LEVELS)}]}, _think)),
    Field("logprobs", Boolean(), default=False),
    Field("top_logprobs", Integer(0, 20)),
    wording=OLLAMA,
)
CHAT = COMMON + Table(
    Field(
        "messages",
        Array(
            MESSAGE.schema(additionalProperties=True), "PANTHEON_MAX_MESSAGES", reader=conversation
        ),
        description='Empty or absent: Ollama\'s "load the model" answer.',
        default=(),
    ),
    Field(
        "tools",
        Array(TOOL.schema(additionalProperties=True), "PANTHEON_MAX_TOOLS", reader=tools),
        default=(),
    ),
)
_REFUSED = "Non-empty: a 400."
GENERATE = COMMON + Table(
    Field("prompt", _STRING),
    Field("system", _STRING),
    Field("raw", Boolean(), description="The prompt as is: no template."),
    Field("template", _STRING, description=_REFUSED),
    Field("suffix", _STRING, description=_REFUSED),
    Field("context", Array(max_items=0), description=_REFUSED),
    Field("images", Array(max_items=0)),
)
EMBED = Table(
    MODEL,
    Field(
        "input",
        Shape({"anyOf": [_STRING.schema(), Array(_STRING, MAX_EMBED_INPUTS).schema()]}),
        nullable=False,
    ),
    Field("truncate", Boolean(), default=True),
    Field("dimensions", Integer()),
    _OPTIONS,
    _KEEP_ALIVE,
    wording=OLLAMA,
)
EMBEDDINGS = Table(MODEL, Field("prompt", _STRING), _OPTIONS, _KEEP_ALIVE, wording=OLLAMA)
_NAME = String(IDENTIFIER_MAX, min_length=1)
SHOW = Table(
    Field("model", _NAME, nullable=False),
    Field("name", _NAME, nullable=False),
    Field("verbose", Boolean(), default=False),
    wording=OLLAMA,
)


# --- the requests ----------------------------------------------------------------------


def model_name(data: dict) -> str:
    """`model`, required (Ollama: "model is required"); `name` is its old spelling."""
    value = data.get("model")
    key = "model"
    if value is None and data.get("name") is not None:
        value, key = data.get("name"), "name"
    if value is None or value == "":
        raise invalid_request("model is required", "model")
    return MODEL.kind.read(value, key, OLLAMA)


def name_candidates(model: str) -> list[str]:
    """The names an Ollama model name may stand for, in order: as sent, then without a
    `:latest` tag (Ollama's default tag). Any other tag resolves only through a served
    name or an alias spelled with that tag."""
    out = [model]
    if model.endswith(LATEST) and len(model) > len(LATEST):
        out.append(model[: -len(LATEST)])
    return out


def ollama_name(name: str) -> str:
    """A served name or alias as Ollama clients list it: with a tag (`:latest` when it
    has none)."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def _sampling(options: dict, *, logprobs: bool, top_logprobs: int) -> SamplingParams:
    """`options` (OPTIONS read) as SamplingParams: num_predict <= 0 or absent is the
    server's default, 1024, as /v1/chat/completions without max_tokens."""
    num_predict = options["num_predict"]
    if num_predict is None or num_predict <= 0:
        max_tokens = DEFAULT_MAX_TOKENS
    else:
        max_tokens = min(num_predict, MAX_TOKENS_CLAMP)
    top_k = options["top_k"]
    return SamplingParams(
        temperature=options["temperature"],
        top_k=DEFAULT_TOP_K if top_k is None else top_k,
        top_p=options["top_p"],
        max_tokens=max_tokens,
        stop=options["stop"],
        seed=options["seed"],
        presence_penalty=max(-2.0, min(2.0, options["presence_penalty"])),
        frequency_penalty=max(-2.0, min(2.0, options["frequency_penalty"])),
        repetition_penalty=options["repeat_penalty"],
        min_p=options["min_p"],
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def _common(data: dict, header_session: str | None) -> dict:
    """The fields /api/chat and /api/generate share, in the order they were always
    checked (the first fault found is the one answered)."""
    raw_options = COMMON.value(data, "options") or {}
    logprobs = COMMON.value(data, "logprobs")
    top_logprobs = COMMON.value(data, "top_logprobs")
    if top_logprobs is None:
        top_logprobs = 0
    else:
        logprobs = logprobs or top_logprobs > 0
    stream = COMMON.value(data, "stream")
    model = model_name(data)
    response_format = COMMON.value(data, "format")
    enable_thinking = COMMON.value(data, "think")
    level = data.get("think")
    options = OPTIONS.read(raw_options, prefix="options.")
    if header_session is not None and len(header_session) > IDENTIFIER_MAX:
        raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
    return dict(
        model=model,
        response_format=response_format,
        enable_thinking=enable_thinking,
        reasoning_effort=level if level in THINK_LEVELS else None,
        sampling=_sampling(options, logprobs=logprobs, top_logprobs=top_logprobs),
        stream=True if stream is None else stream,  # Ollama streams by default
        num_ctx=options["num_ctx"],
        logprobs=logprobs,
        session_id=header_session or None,
        keep_alive=COMMON.value(data, "keep_alive"),
    )


def parse_chat(data: dict, header_session: str | None = None) -> OllamaRequest:
    """POST /api/chat's body validated; raises the 400 ApiError naming the field."""
    common = _common(data, header_session)
    return OllamaRequest(
        messages=CHAT.value(data, "messages"), tools=CHAT.value(data, "tools"), **common
    )


def parse_generate(data: dict, header_session: str | None = None) -> OllamaRequest:
    """POST /api/generate's body: `prompt` (and `system`) as a one-turn conversation
    through the model's chat template, or with `raw` the prompt as is (no template).
    `template`, `suffix`, `context` and `images` are refused clearly (see README,
    "Ollama API")."""
    common = _common(data, header_session)
    prompt = GENERATE.value(data, "prompt")
    system = GENERATE.value(data, "system")
    refuse_images(data.get("images"), "images")
    if GENERATE.value(data, "template"):
        raise invalid_request(
            "template: overriding the prompt template per request is not supported: the "
            "model's chat template is the operator's (a load option); send messages to "
            "/api/chat, or leave `template` out",
            "template",
        )
    if GENERATE.value(data, "suffix"):
        raise invalid_request(
            "suffix: fill-in-the-middle is not supported by the models this server runs",
            "suffix",
        )
    context = data.get("context")
    if context is not None and context != []:
        raise invalid_request(
            "context: the token context of an earlier /api/generate answer is not "
            "supported (none is returned): send the conversation to /api/chat, with an "
            "X-Session-Id header to reuse its cache",
            "context",
        )
    if GENERATE.value(data, "raw"):
        if system:
            raise invalid_request(
                "system: with raw the prompt is sent as is (no template to put a system "
                "prompt in); write it into the prompt, or leave raw out",
                "system",
            )
        # No messages: an empty prompt is still Ollama's "load the model".
        messages = ({"role": "user", "content": prompt},) if prompt else ()
        return OllamaRequest(messages=messages, tools=(), raw_prompt=prompt or None, **common)
    messages: list[dict] = []
    if prompt:
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
    return OllamaRequest(messages=tuple(messages), tools=(), **common)


def parse_show(data: dict) -> tuple[str, bool]:
    """(model, verbose)."""
    return model_name(data), SHOW.value(data, "verbose")


def parse_embed(data: dict, *, legacy: bool) -> EmbedRequest:
    """/api/embed's `input` (a string or an array of strings), `truncate`, `dimensions`;
    or the legacy /api/embeddings' `prompt` (one string). `options` and `keep_alive` are
    checked and otherwise unused (no sampling here)."""
    model = model_name(data)
    key = "prompt" if legacy else "input"
    value = data.get(key)
    if value is None:
        value = "" if legacy else []
    if isinstance(value, str):
        inputs = [value] if value or not legacy else []
    elif isinstance(value, list) and not legacy and all(isinstance(s, str) for s in value):
        inputs = list(value)
    else:
        expected = "a string" if legacy else "a string or an array of strings"
        raise invalid_request(f"{key}: expected {expected}, got {json_kind(value)}", key)
    if len(inputs) > MAX_EMBED_INPUTS:
        raise invalid_request(f"{key}: at most {MAX_EMBED_INPUTS} inputs", key)
    if not legacy and any(not s for s in inputs):
        raise invalid_request(f"{key}: an input is an empty string: nothing to embed", key)
    EMBED.value(data, "options")
    EMBED.value(data, "keep_alive")
    return EmbedRequest(
        model, inputs, EMBED.value(data, "truncate"), EMBED.value(data, "dimensions")
    )
