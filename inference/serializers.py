"""Request validation at the HTTP edge: JSON in, frozen engine dataclasses out.

The fields are strict about JSON types: DRF's stock fields coerce strings ("0.5", "yes"),
which would let a typo through as a value nobody asked for. `null` means "not given".
"""

from __future__ import annotations

import json
import math
import re

from django.conf import settings
from rest_framework import serializers

from inference.engine.types import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_CHOICES,
    MAX_TOKENS_CLAMP,
    NONPOSITIVE_MAX_TOKENS,
    SamplingParams,
)
from inference.errors import invalid_request

# Bounds on what a body may hold (README "Limits"); the body's byte size is bounded before
# it is read (pantheon_site/limits.py).
MAX_JSON_DEPTH = 64  # nested arrays/objects, the body's own object included
IDENTIFIER_MAX = 256  # model names, session ids, stop strings
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 1024  # entries
INT64_BOUND = 1 << 64  # integers beyond +-2**64 are refused, whatever the field
TEMPERATURE_RANGE = (-100.0, 100.0)  # <= 0 is greedy
REPETITION_PENALTY_MAX = 100.0


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    """A finite JSON number (1e400 parses as infinity: refused). min_value/max_value give
    the field's range (DRF's validators, a 400 naming the bound)."""

    default_error_messages = {"out_of_range": "Must be a finite number (|value| < 2**64)."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, int) and abs(data) >= INT64_BOUND:
            self.fail("out_of_range")  # float(10**400) would raise OverflowError
        if not math.isfinite(data):
            self.fail("invalid")
        return float(data)


class StrictIntegerField(serializers.IntegerField):
    """An integer (or a float with no fraction, 3.0); at most 64 bits whatever the field's
    own range, so that no arbitrary-precision value reaches the engine."""

    default_error_messages = {"out_of_range": "Must be a 64-bit integer (|value| < 2**64)."}

    def to_internal_value(self, data):
        if isinstance(data, float) and data.is_integer():
            data = int(data)
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        if abs(data) >= INT64_BOUND:
            self.fail("out_of_range")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StopField(serializers.Field):
    """`stop`: a string or an array of strings, normalised to a tuple (empties dropped)."""

    default_error_messages = {
        "invalid": "Must be a string or an array of strings.",
        "too_many": f"At most {MAX_STOP_STRINGS} stop strings.",
        "too_long": f"A stop string may have at most {IDENTIFIER_MAX} characters.",
    }

    def to_internal_value(self, data):
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
            self.fail("invalid")
        if len(data) > MAX_STOP_STRINGS:
            self.fail("too_many")
        if any(len(s) > IDENTIFIER_MAX for s in data):
            self.fail("too_long")
        return tuple(s for s in data if s)

    def to_representation(self, value):
        return list(value)


class LogitBiasField(serializers.Field):
    """`logit_bias`: {"<token id>": bias}. The contract: bias clamped to [-100, 100];
    non-numeric keys or values are skipped (not an error). Normalised to ((id, bias), ...)."""

    default_error_messages = {
        "invalid": "Must be an object of token id -> bias.",
        "too_many": f"At most {MAX_LOGIT_BIAS} entries.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            self.fail("invalid")
        if len(data) > MAX_LOGIT_BIAS:
            self.fail("too_many")
        out = []
        for key, value in data.items():
            # ASCII digits only ("²".isdigit() is true; int() refuses it), and at most ten
            # of them: an id past int32 is outside any vocabulary, skipped like one.
            match = _TOKEN_ID.fullmatch(key) if isinstance(key, str) else None
            if match is None or int(match[1]) >= 1 << 31:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if isinstance(value, float) and not math.isfinite(value):
                continue
            # Clamped before float(): float(10**400) would overflow.
            out.append((int(match[1]), float(max(-100, min(100, value)))))
        return tuple(out)

    def to_representation(self, value):
        return {str(k): v for k, v in value}


_TOKEN_ID = re.compile(r"\s*([0-9]{1,10})\s*")


class BoundedListField(serializers.ListField):
    """A ListField whose length bound is a setting, checked before any item is validated
    (a million items are refused at once, not after a million child validations)."""

    def __init__(self, *, setting: str, **kwargs):
        self.setting = setting
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        limit = getattr(settings, self.setting)
        if isinstance(data, list) and len(data) > limit:
            raise serializers.ValidationError(
                f"At most {limit} items ({self.setting}); got {len(data)}."
            )
        return super().to_internal_value(data)


# The roles a chat message may have. A missing (or null) role is `user` (the contract);
# OpenAI's `developer` is the system prompt of its newer models: read as `system`.
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
ROLE_ALIASES = {"developer": "system"}
# What each kind of non-text content part would need; none of the engine's models has it.
_UNSUPPORTED_PARTS = {
    "image_url": "see images",
    "input_image": "see images",
    "image": "see images",
    "input_audio": "hear audio",
    "audio": "hear audio",
    "video_url": "see video",
    "file": "read files",
    "input_file": "read files",
}


class MessagesField(BoundedListField):
    """`messages`: a non-empty list of objects whose `role` is known and whose `content`
    is a string, null, or a list of text parts. A part the models cannot take (an image,
    audio, a file) is refused naming it, never dropped; `developer` becomes `system`.
    Other keys (tool_calls, reasoning_content, name, ...) are kept as given; a content of
    any other type is read as empty by the template layer (the contract)."""

    def __init__(self, **kwargs):
        super().__init__(child=serializers.DictField(), allow_empty=False, **kwargs)

    def to_internal_value(self, data):
        messages = super().to_internal_value(data)
        for i, message in enumerate(messages):
            problem = _message_problem(message)
            if problem is not None:
                raise serializers.ValidationError({i: problem})
            role = message.get("role")
            if role in ROLE_ALIASES:
                messages[i] = {**message, "role": ROLE_ALIASES[role]}
        return messages


def _message_problem(message: dict) -> dict | None:
    """What is wrong with one message, as DRF's error tree under it ({"role": [why]},
    {"content": {part index: [why]}}), or None."""
    role = message.get("role")
    if role is not None and not isinstance(role, str):
        return {"role": ["Must be a string."]}
    if role and role not in MESSAGE_ROLES:
        hint = " (send tool results as role 'tool')" if role == "function" else ""
        return {
            "role": [f"unknown role {role!r}{hint}; expected one of {', '.join(MESSAGE_ROLES)}"]
        }
    content = message.get("content")
    if not isinstance(content, list):
        return None
    for j, part in enumerate(content):
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            return {"content": {j: ['a content part must be an object like {"type": "text", ...}']}}
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return {"content": {j: {"text": ["Must be a string."]}}}
            continue
        if not isinstance(kind, str) or not kind:
            return {"content": {j: {"type": ['missing; expected "text"']}}}
        need = _UNSUPPORTED_PARTS.get(kind)
        why = f"no loaded model can {need}" if need else "only text parts are"
        return {"content": {j: [f"{kind} parts are not supported: {why}"]}}
    return None


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = StrictBooleanField(required=False, allow_null=True)


class ChatCompletionRequest(serializers.Serializer):
    """POST /v1/chat/completions. Fields the engine does not implement yet are ignored."""

    model = StrictCharField(
        required=False, allow_null=True, allow_blank=True, max_length=IDENTIFIER_MAX
    )
    # Roles and content parts are checked here (MessagesField); the rest of message
    # normalisation (missing role, non-string content) belongs to the chat template layer.
    messages = MessagesField(setting="PANTHEON_MAX_MESSAGES")
    temperature = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=TEMPERATURE_RANGE[0],
        max_value=TEMPERATURE_RANGE[1],
    )
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    top_k = StrictIntegerField(  # <= 0 disables it
        required=False, allow_null=True, min_value=-(1 << 31), max_value=(1 << 31) - 1
    )
    max_tokens = StrictIntegerField(required=False, allow_null=True)
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = StrictIntegerField(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True, min_value=1)
    stream = StrictBooleanField(required=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    presence_penalty = StrictFloatField(required=False, allow_null=True)
    frequency_penalty = StrictFloatField(required=False, allow_null=True)
    repetition_penalty = StrictFloatField(
        required=False, allow_null=True, max_value=REPETITION_PENALTY_MAX
    )
    min_p = StrictFloatField(required=False, allow_null=True)
    logit_bias = LogitBiasField(required=False, allow_null=True)
    logprobs = StrictBooleanField(required=False, allow_null=True)
    top_logprobs = StrictIntegerField(required=False, allow_null=True)
    response_format = serializers.DictField(required=False, allow_null=True)
    enable_thinking = StrictBooleanField(required=False, allow_null=True)
    reasoning_budget = StrictIntegerField(required=False, allow_null=True)
    max_reasoning_tokens = StrictIntegerField(required=False, allow_null=True)
    # OpenAI tools; their entries and tool_choice are checked in views._tools (the
    # dialect's parse_tools), which also decides the grammar.
    tools = BoundedListField(
        child=serializers.DictField(), required=False, allow_null=True, setting="PANTHEON_MAX_TOOLS"
    )
    tool_choice = serializers.JSONField(required=False, allow_null=True)
    # Prefix-cache key, by precedence (then the X-Session-Id header): see session_key().
    session_id = StrictCharField(required=False, allow_null=True, max_length=IDENTIFIER_MAX)
    prompt_cache_key = StrictCharField(required=False, allow_null=True, max_length=IDENTIFIER_MAX)
    promptCacheKey = StrictCharField(  # noqa: N815
        required=False, allow_null=True, max_length=IDENTIFIER_MAX
    )

    def session_key(self, header: str | None) -> str | None:
        """The session id: `session_id`, `prompt_cache_key`, `promptCacheKey`, then the
        X-Session-Id header (the contract's order); None when none is given (or blank)."""
        data = self.validated_data
        for value in (
            data.get("session_id"),
            data.get("prompt_cache_key"),
            data.get("promptCacheKey"),
            header,
        ):
            if value:
                if len(value) > IDENTIFIER_MAX:  # only the header can still be longer
                    raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
                return value
        return None

    def sampling_params(self) -> SamplingParams:
        data = self.validated_data
        return SamplingParams(
            temperature=_given(data, "temperature", DEFAULT_TEMPERATURE),
            top_k=_given(data, "top_k", DEFAULT_TOP_K),
            top_p=_given(data, "top_p", DEFAULT_TOP_P),
            max_tokens=resolve_max_tokens(
                data.get("max_tokens"), data.get("max_completion_tokens")
            ),
            stop=data.get("stop") or (),
            seed=data.get("seed"),
            presence_penalty=_clamp(_given(data, "presence_penalty", 0.0), -2.0, 2.0),
            frequency_penalty=_clamp(_given(data, "frequency_penalty", 0.0), -2.0, 2.0),
            repetition_penalty=_given(data, "repetition_penalty", 1.0),
            min_p=_clamp(_given(data, "min_p", 0.0), 0.0, 1.0),
            logit_bias=data.get("logit_bias") or (),
            logprobs=bool(data.get("logprobs")) or self.top_logprobs_clamped > 0,
            top_logprobs=self.top_logprobs_clamped,
        )

    def validate(self, attrs):
        # OpenAI's answer too: a call cannot be compelled when no function is offered.
        choice = attrs.get("tool_choice")
        if not attrs.get("tools") and (choice == "required" or isinstance(choice, dict)):
            spelled = '"required"' if choice == "required" else "a named function"
            raise serializers.ValidationError(
                {"tool_choice": [f"{spelled} needs `tools`: there is no function to call"]}
            )
        return attrs

    def validate_repetition_penalty(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than 0 (1 disables it)")
        return value

    @property
    def top_logprobs_clamped(self) -> int:
        """`top_logprobs` clamped to [0, 20] (the contract); it implies `logprobs`."""
        return int(_clamp(_given(self.validated_data, "top_logprobs", 0), 0, 20))

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.validated_data.get("logprobs")) or self.top_logprobs_clamped > 0

    def requested_reasoning_budget(self) -> int | None:
        """`reasoning_budget`, else its alias `max_reasoning_tokens`; None: the model's."""
        data = self.validated_data
        value = data.get("reasoning_budget")
        return value if value is not None else data.get("max_reasoning_tokens")

    @property
    def tools_active(self) -> bool:
        """Tools offered and not switched off with tool_choice "none"."""
        data = self.validated_data
        return bool(data.get("tools")) and data.get("tool_choice") != "none"

    @property
    def n_requested(self) -> int:
        return _given(self.validated_data, "n", 1)

    @property
    def n_choices(self) -> int:
        """Choices to generate: `n`, capped at 8 (the contract; n_status says so)."""
        return min(self.n_requested, MAX_CHOICES)

    # Not named `stream`: a property would shadow the declared field of that name.
    @property
    def is_stream(self) -> bool:
        return bool(self.validated_data.get("stream"))

    @property
    def wants_usage(self) -> bool:
        options = self.validated_data.get("stream_options") or {}
        return bool(options.get("include_usage"))


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _given(data: dict, key: str, default):
    value = data.get(key)
    return default if value is None else value


def resolve_max_tokens(max_tokens: int | None, max_completion_tokens: int | None) -> int:
    """The contract's rule: max_tokens wins over its alias; unset -> 1024; 0 or negative
    -> 512; at most 1048576."""
    value = max_tokens if max_tokens is not None else max_completion_tokens
    if value is None:
        return DEFAULT_MAX_TOKENS
    if value <= 0:
        return NONPOSITIVE_MAX_TOKENS
    return min(value, MAX_TOKENS_CLAMP)


def parse_json_object(body: bytes) -> dict:
    """The request body as a JSON object, or a 400: the one parser of every JSON route.
    Content-Type is not checked (the contract: the body is parsed as JSON regardless).
    Nesting is bounded (MAX_JSON_DEPTH); NaN/Infinity literals and integers past Python's
    4300 digits are refused; the body's size was bounded before it was read."""
    if not body.strip():
        raise invalid_request("request body is empty; expected a JSON object")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except RecursionError:
        raise invalid_request(_too_deep()) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid_request(
            f"request body must be a JSON object, not {type(data).__name__ if data is not None else 'null'}"
        )
    if _too_nested(data):
        raise invalid_request(_too_deep())
    where = lone_surrogate_at(data)
    if where is not None:
        path, char = where
        raise invalid_request(
            f"{path or 'request body'}: contains a lone UTF-16 surrogate "
            f"(U+{ord(char):04X}), which is not Unicode text; send well-formed strings",
            param=path,
        )
    return data


def _too_deep() -> str:
    return (
        f"request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays and objects"
    )


def _too_nested(data: dict) -> bool:
    """Whether arrays/objects nest deeper than MAX_JSON_DEPTH (the body's object is level
    1). Iterative: the check itself must not recurse."""
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def lone_surrogate_at(data: dict) -> tuple[str, str] | None:
    """(the path of the first string, key or value, holding a lone surrogate, e.g.
    `messages[0].content`, and that code point) or None. JSON text may spell one
    (`"\\ud800"`); Python keeps it in the str, and no tokenizer or encoder takes it.
    Iterative, in document order."""
    stack: list[tuple[object, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            char = _lone_surrogate(node)
            if char is not None:
                return path, char
            continue
        children = []
        if isinstance(node, dict):
            for key, value in node.items():
                char = _lone_surrogate(key)
                if char is not None:  # named as \udXXX: the error itself stays well-formed
                    key = key.encode("utf-8", "backslashreplace").decode("utf-8")
                sub = f"{path}.{key}" if path else key
                if char is not None:
                    return sub, char
                children.append((value, sub))
        elif isinstance(node, list):
            children = [(value, f"{path}[{i}]") for i, value in enumerate(node)]
        stack.extend(reversed(children))
    return None


def _lone_surrogate(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")  # a paired escape was joined by the parser: any left is lone
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _reject_constant(name: str):
    # Python's json accepts NaN/Infinity, which are not JSON.
    raise ValueError(f"{name} is not valid JSON")


def validated_chat_request(body: bytes) -> ChatCompletionRequest:
    request = ChatCompletionRequest(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request


def invalid_errors(errors: dict):
    """The 400 for DRF's error tree: its first error, named (message and `param`)."""
    path, message = _first_error(errors, "")
    return invalid_request(f"{path}: {message}" if path else message, param=path or None)


def format_errors(errors: dict) -> str:
    """DRF's error tree as one line that names the field: `messages[0]: Expected a ...`."""
    path, message = _first_error(errors, "")
    return f"{path}: {message}" if path else message


def _first_error(node, path: str) -> tuple[str, str]:
    if isinstance(node, dict) and node:
        key, value = next(iter(node.items()))
        if key == "non_field_errors":
            return _first_error(value, path)
        sub = f"[{key}]" if isinstance(key, int) or str(key).isdigit() else f".{key}"
        return _first_error(value, f"{path}{sub}" if path else str(key))
    if isinstance(node, list) and node:
        return _first_error(node[0], path)
    return path, str(node)
