"""Ollama requests (POST /api/chat, /api/generate, /api/embed, /api/show) into the chat
core's Turn.

Ollama's shapes become the neutral (OpenAI chat) messages the core renders: an
assistant's `tool_calls` ({function: {name, arguments: OBJECT}}) get ids and JSON-text
arguments; a `tool` message is tied to its call by `tool_call_id` when given, else by
`tool_name` (the oldest unanswered call of that name), else to the oldest unanswered
call. `options` map onto our sampling; unknown options are ignored (as Ollama ignores
them), known ones of the wrong type are a 400 naming the option. Unset options take this
server's defaults (those of /v1/chat/completions), not an Ollama Modelfile's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from django.conf import settings

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
    INT64_BOUND,
    MAX_STOP_STRINGS,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    json_kind,
    tool_objects,
)

THINK_LEVELS = ("high", "medium", "low")  # Ollama's levels: any of them turns thinking on
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
# Ollama's duration strings (Go's time.ParseDuration): "5m", "1h30m", "-1s", "0.5h". The
# pattern is for the OpenAPI document only: requests are read by parse_duration, a linear
# scan (a backtracking regex on a client's string froze the process: durations.py).
DURATION_PATTERN = (
    r"^\s*[+-]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))*\s*$"
)
LATEST = ":latest"


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

    def turn(self, request_id: str) -> Turn:
        return Turn(
            messages=self.messages,
            tools=self.tools,
            response_format=self.response_format,
            enable_thinking=self.enable_thinking,
            sampling=self.sampling,
            logprobs=self.logprobs,
            request_id=request_id,
            raw_prompt=self.raw_prompt,
        )


# --- scalars -------------------------------------------------------------------------


kind = json_kind


def _integer(value: object, path: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{path}: expected an integer, got {kind(value)}", path)
    if abs(value) >= INT64_BOUND:
        raise invalid_request(f"{path}: must be a 64-bit integer (|value| < 2**64)", path)
    return value


def _number(value: object, path: str, low: float | None = None, high: float | None = None):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"{path}: expected a number, got {kind(value)}", path)
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid_request(f"{path}: expected a finite number", path)
    if abs(value) >= INT64_BOUND:
        raise invalid_request(f"{path}: must be below 2**64 in magnitude", path)
    if low is not None and high is not None and not low <= value <= high:
        raise invalid_request(f"{path}: must be between {low:g} and {high:g}", path)
    return float(value)


def _bool(data: dict, key: str) -> bool | None:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_request(f"{key}: expected a boolean, got {kind(value)}", key)
    return value


def _string(data: dict, key: str, max_length: int | None = None) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_request(f"{key}: expected a string, got {kind(value)}", key)
    if max_length is not None and len(value) > max_length:
        raise invalid_request(f"{key}: at most {max_length} characters", key)
    return value


def model_name(data: dict) -> str:
    """`model`, required (Ollama: "model is required"); `name` is its old spelling."""
    value = data.get("model")
    key = "model"
    if value is None and data.get("name") is not None:
        value, key = data.get("name"), "name"
    if value is None or value == "":
        raise invalid_request("model is required", "model")
    if not isinstance(value, str):
        raise invalid_request(f"{key}: expected a string, got {kind(value)}", key)
    if len(value) > IDENTIFIER_MAX:
        raise invalid_request(f"{key}: at most {IDENTIFIER_MAX} characters", key)
    return value


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


def keep_alive(data: dict) -> object:
    """`keep_alive`: a number of seconds or a Go duration string ("5m", "-1", "0").
    Models stay loaded as the operator loaded them; with a session (X-Session-Id) it is
    that conversation's idle TTL in the session cache (README, "Ollama API")."""
    value = data.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, str):
        if len(value) > DURATION_MAX_CHARS:
            raise invalid_request(
                f"keep_alive: at most {DURATION_MAX_CHARS} characters", "keep_alive"
            )
        if parse_duration(value) is None:
            raise invalid_request(
                f'keep_alive: {json.dumps(value)} is not a duration (e.g. "5m", "1h", '
                '"-1", or a number of seconds)',
                "keep_alive",
            )
        return value
    return _number(value, "keep_alive")


def session_id(header: str | None) -> str | None:
    if header is not None and len(header) > IDENTIFIER_MAX:
        raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
    return header or None


# --- options -------------------------------------------------------------------------


def options_of(data: dict) -> dict:
    value = data.get("options")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_request(f"options: expected an object, got {kind(value)}", "options")
    return value


def _stop(value: object) -> tuple[str, ...]:
    path = "options.stop"
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_request(f"{path}: expected an array of strings", path)
    if len(value) > MAX_STOP_STRINGS:
        raise invalid_request(f"{path}: at most {MAX_STOP_STRINGS} strings", path)
    if any(len(s) > IDENTIFIER_MAX for s in value):
        raise invalid_request(
            f"{path}: a string may have at most {IDENTIFIER_MAX} characters", path
        )
    return tuple(s for s in value if s)


def sampling(options: dict, *, logprobs: bool, top_logprobs: int) -> SamplingParams:
    """`options` as SamplingParams: num_predict (<= 0 or absent: the server's default,
    1024, as /v1/chat/completions without max_tokens), temperature, top_k, top_p, min_p,
    seed, stop, repeat_penalty, presence_penalty, frequency_penalty. Other options
    (num_ctx is checked apart; num_thread, mirostat, ...) are ignored, as Ollama does."""

    def get(key: str):
        return options.get(key)

    def number(key: str, low=None, high=None, default=None):
        value = get(key)
        return default if value is None else _number(value, f"options.{key}", low, high)

    def integer(key: str):
        value = get(key)
        return None if value is None else _integer(value, f"options.{key}")

    num_predict = integer("num_predict")
    if num_predict is None or num_predict <= 0:
        max_tokens = DEFAULT_MAX_TOKENS
    else:
        max_tokens = min(num_predict, MAX_TOKENS_CLAMP)
    top_k = integer("top_k")
    if top_k is not None and not -(1 << 31) <= top_k < 1 << 31:
        raise invalid_request("options.top_k: must fit in 32 bits", "options.top_k")
    repeat = number("repeat_penalty", default=1.0)
    if repeat <= 0 or repeat > REPETITION_PENALTY_MAX:
        raise invalid_request(
            f"options.repeat_penalty: must be above 0 and at most {REPETITION_PENALTY_MAX:g} "
            "(1 disables it)",
            "options.repeat_penalty",
        )
    return SamplingParams(
        temperature=number("temperature", *TEMPERATURE_RANGE, default=DEFAULT_TEMPERATURE),
        top_k=DEFAULT_TOP_K if top_k is None else top_k,
        top_p=number("top_p", 0.0, 1.0, default=DEFAULT_TOP_P),
        max_tokens=max_tokens,
        stop=_stop(get("stop")),
        seed=integer("seed"),
        presence_penalty=max(-2.0, min(2.0, number("presence_penalty", default=0.0))),
        frequency_penalty=max(-2.0, min(2.0, number("frequency_penalty", default=0.0))),
        repetition_penalty=repeat,
        min_p=number("min_p", 0.0, 1.0, default=0.0),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )


def num_ctx(options: dict) -> int | None:
    value = options.get("num_ctx")
    if value is None:
        return None
    value = _integer(value, "options.num_ctx")
    if value < 1:
        raise invalid_request("options.num_ctx: must be at least 1", "options.num_ctx")
    return value


def _logprobs(data: dict) -> tuple[bool, int]:
    wanted = _bool(data, "logprobs") or False
    top = data.get("top_logprobs")
    if top is None:
        return wanted, 0
    top = _integer(top, "top_logprobs")
    if not 0 <= top <= 20:
        raise invalid_request("top_logprobs: must be between 0 and 20", "top_logprobs")
    return wanted or top > 0, top


# --- format, think ---------------------------------------------------------------------


def response_format(data: dict) -> dict | None:
    """`format`: "json" -> a JSON object; a JSON schema object -> that schema (both
    enforced by the grammar); "" or absent -> plain text."""
    value = data.get("format")
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": value, "strict": True},
        }
    raise invalid_request(
        f'format: expected "json" or a JSON schema object, got {json.dumps(value)[:80]}',
        "format",
    )


def think(data: dict) -> bool | None:
    """`think`: true/false, or a level ("high", "medium", "low": thinking on; the level
    is not a budget here). Absent: the server's default."""
    value = data.get("think")
    if value is None or isinstance(value, bool):
        return value
    if value in THINK_LEVELS:
        return True
    raise invalid_request(
        f'think: expected true, false, "high", "medium" or "low", got {json.dumps(value)[:80]}',
        "think",
    )


def _images(value: object, path: str) -> None:
    if value is None or value == []:
        return
    raise invalid_request(
        f"{path}: images are not supported: no model this server runs can read images; send text",
        path,
    )


# --- the conversation ----------------------------------------------------------------


def _arguments(value: object, path: str) -> str:
    """A call's arguments as JSON text (Ollama sends an object; a JSON string is read)."""
    if isinstance(value, str):
        try:
            value = json.loads(value or "{}")
        except ValueError:
            raise invalid_request(f"{path}: expected an object", path) from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise invalid_request(f"{path}: expected an object, got {kind(value)}", path)
    return json.dumps(value, ensure_ascii=False)


def _tool_calls(value: object, path: str, ids: list[str]) -> list[dict]:
    if not isinstance(value, list):
        raise invalid_request(f"{path}: expected an array, got {kind(value)}", path)
    calls = []
    for j, call in enumerate(value):
        where = f"{path}.{j}"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise invalid_request(f"{where}.function: expected an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(
                f"{where}.function.name: expected a string", f"{where}.function.name"
            )
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{len(ids)}"
        ids.append(call_id)
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": _arguments(
                        function.get("arguments"), f"{where}.function.arguments"
                    ),
                },
            }
        )
    return calls


def conversation(raw: object) -> tuple[dict, ...]:
    """`messages` in the neutral form. An empty list is Ollama's "load the model"."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid_request(f"messages: expected an array, got {kind(raw)}", "messages")
    limit = settings.PANTHEON_MAX_MESSAGES
    if len(raw) > limit:
        raise invalid_request(
            f"messages: at most {limit} messages (PANTHEON_MAX_MESSAGES); got {len(raw)}",
            "messages",
        )
    out: list[dict] = []
    ids: list[str] = []  # every call id, in order
    names: dict[str, str] = {}  # call id -> function name
    answered: set[str] = set()
    for i, message in enumerate(raw):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise invalid_request(f"{path}: expected an object, got {kind(message)}", path)
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise invalid_request(
                f"{path}.role: expected one of {', '.join(MESSAGE_ROLES)}, got "
                f"{json.dumps(role)[:80]}",
                f"{path}.role",
            )
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise invalid_request(
                f"{path}.content: expected a string, got {kind(content)}", f"{path}.content"
            )
        _images(message.get("images"), f"{path}.images")
        neutral: dict = {"role": role, "content": content}
        if role == "assistant":
            thinking = message.get("thinking")
            if thinking is not None and not isinstance(thinking, str):
                raise invalid_request(f"{path}.thinking: expected a string", f"{path}.thinking")
            if thinking:
                neutral["reasoning_content"] = thinking
            if message.get("tool_calls"):
                neutral["tool_calls"] = _tool_calls(
                    message["tool_calls"], f"{path}.tool_calls", ids
                )
                for call in neutral["tool_calls"]:
                    names[call["id"]] = call["function"]["name"]
        elif role == "tool":
            neutral["tool_call_id"] = _tool_result_id(message, path, ids, names, answered)
        out.append(neutral)
    if out and out[-1]["role"] == "assistant":
        last = f"messages.{len(out) - 1}"
        raise invalid_request(
            f"{last}: the last message is the assistant's: continuing it (prefill) is not "
            "supported here; end with a user or tool message",
            last,
        )
    return tuple(out)


def _tool_result_id(
    message: dict, path: str, ids: list[str], names: dict[str, str], answered: set[str]
) -> str:
    """The call a tool message answers: its `tool_call_id`, else the oldest unanswered
    call named `tool_name`, else the oldest unanswered call ("" when none)."""
    given = message.get("tool_call_id")
    if given is not None and not isinstance(given, str):
        raise invalid_request(f"{path}.tool_call_id: expected a string", f"{path}.tool_call_id")
    tool_name = message.get("tool_name")
    if tool_name is not None and not isinstance(tool_name, str):
        raise invalid_request(f"{path}.tool_name: expected a string", f"{path}.tool_name")
    open_calls = [i for i in ids if i not in answered]
    if given:
        chosen = given
    else:
        named = [i for i in open_calls if tool_name and names.get(i) == tool_name]
        chosen = (named or open_calls or [""])[0]
    if chosen:
        answered.add(chosen)
    return chosen


def tools(value: object) -> tuple[dict, ...]:
    """Ollama's tools are OpenAI function tools ({type: "function", function: {name,
    description, parameters}}); the core checks each one."""
    out = []
    for path, tool in tool_objects(value):
        if tool.get("type", "function") != "function":
            raise invalid_request(
                f'{path}.type: only "function" tools are supported', f"{path}.type"
            )
        if not isinstance(tool.get("function"), dict):
            raise invalid_request(f"{path}.function: expected an object", f"{path}.function")
        out.append({**tool, "type": "function"})
    return tuple(out)


# --- the requests ----------------------------------------------------------------------


def _common(data: dict, header_session: str | None) -> dict:
    options = options_of(data)
    logprobs, top_logprobs = _logprobs(data)
    stream = _bool(data, "stream")
    return dict(
        model=model_name(data),
        response_format=response_format(data),
        enable_thinking=think(data),
        sampling=sampling(options, logprobs=logprobs, top_logprobs=top_logprobs),
        stream=True if stream is None else stream,  # Ollama streams by default
        num_ctx=num_ctx(options),
        logprobs=logprobs,
        session_id=session_id(header_session),
        keep_alive=keep_alive(data),
    )


def parse_chat(data: dict, header_session: str | None = None) -> OllamaRequest:
    """POST /api/chat's body validated; raises the 400 ApiError naming the field."""
    common = _common(data, header_session)
    return OllamaRequest(
        messages=conversation(data.get("messages")),
        tools=tools(data.get("tools")),
        **common,
    )


def parse_generate(data: dict, header_session: str | None = None) -> OllamaRequest:
    """POST /api/generate's body: `prompt` (and `system`) as a one-turn conversation
    through the model's chat template, or with `raw` the prompt as is (no template).
    `template`, `suffix`, `context` and `images` are refused clearly (see README,
    "Ollama API")."""
    common = _common(data, header_session)
    prompt = _string(data, "prompt")
    system = _string(data, "system")
    _images(data.get("images"), "images")
    if _string(data, "template"):
        raise invalid_request(
            "template: overriding the prompt template per request is not supported: the "
            "model's chat template is the operator's (a load option); send messages to "
            "/api/chat, or leave `template` out",
            "template",
        )
    if _string(data, "suffix"):
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
    if _bool(data, "raw"):
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
    return model_name(data), bool(_bool(data, "verbose"))


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    inputs: list[str]
    truncate: bool  # an input over the window is cut to it (Ollama's default), else a 400
    dimensions: int | None


MAX_EMBED_INPUTS = 2048  # as /v1/embeddings


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
        raise invalid_request(f"{key}: expected {expected}, got {kind(value)}", key)
    if len(inputs) > MAX_EMBED_INPUTS:
        raise invalid_request(f"{key}: at most {MAX_EMBED_INPUTS} inputs", key)
    if not legacy and any(not s for s in inputs):
        raise invalid_request(f"{key}: an input is an empty string: nothing to embed", key)
    options_of(data)
    keep_alive(data)
    truncate = _bool(data, "truncate")
    dimensions = data.get("dimensions")
    if dimensions is not None:
        dimensions = _integer(dimensions, "dimensions")
    return EmbedRequest(model, inputs, True if truncate is None else truncate, dimensions)
