"""The OpenAI chat request at the HTTP edge: JSON in, frozen engine dataclasses out.

Built from the platform's strict fields (pantheon_platform/strict_json.py).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from engine import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_CHOICES,
    MAX_TOKENS_CLAMP,
    NONPOSITIVE_MAX_TOKENS,
    SamplingParams,
)
from pantheon_platform.errors import invalid_request
from pantheon_platform.openapi import ref
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    BoundedListField,
    LogitBiasField,
    PriorityField,
    SpeculationField,
    StopField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    TruncationField,
    invalid_errors,
    parse_json_object,
)
from pantheon_platform.tenancy import SESSION_ID_MAX
from wire.fields import EFFORT_BUDGETS, effort_thinking
from wire.openai_chat.prediction import PredictionField

# What the sampling fields are clamped to (not refused): the contract's ranges.
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty, frequency_penalty
MIN_P_RANGE = (0.0, 1.0)
TOP_LOGPROBS_MAX = 20

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


class EffortField(serializers.ChoiceField):
    """`reasoning_effort` (OpenAI's): thinking on or off and its budget as Responses'
    reasoning.effort, and the template's `reasoning_effort` (gpt-oss)."""

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "help_text",
            '"none" and "minimal" turn thinking off; "low", "medium", "high", "xhigh" bound '
            'the think block (512, 2048, 8192, 16384 tokens), "max" does not. '
            "enable_thinking and reasoning_budget, where given, win. A template that reads "
            "`reasoning_effort` (gpt-oss) gets low, medium or high.",
        )
        super().__init__(list(EFFORT_BUDGETS), required=False, allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class MessagesField(BoundedListField):
    """`messages`: a non-empty list of objects whose `role` is known and whose `content`
    is a string, null, or a list of text parts. A part the models cannot take (an image,
    audio, a file) is refused naming it, never dropped; `developer` becomes `system`.
    Other keys (tool_calls, reasoning_content, name, ...) are kept as given; a content of
    any other type is read as empty by the template layer (the contract)."""

    def __init__(self, **kwargs):
        super().__init__(child=serializers.DictField(), allow_empty=False, **kwargs)

    def openapi_schema(self) -> dict:
        return {
            "type": "array",
            "minItems": 1,
            "maxItems": getattr(settings, self.setting),
            "items": ref("ChatMessage"),
        }

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
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=IDENTIFIER_MAX,
        help_text="Served name or alias; with one model loaded any value (or none) routes to it.",
    )
    # Roles and content parts are checked here (MessagesField); the rest of message
    # normalisation (missing role, non-string content) belongs to the chat template layer.
    messages = MessagesField(setting="PANTHEON_MAX_MESSAGES")
    temperature = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=TEMPERATURE_RANGE[0],
        max_value=TEMPERATURE_RANGE[1],
        help_text=f"Default {DEFAULT_TEMPERATURE}; <= 0 is greedy.",
    )
    top_p = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=0.0,
        max_value=1.0,
        help_text=f"Default {DEFAULT_TOP_P}.",
    )
    top_k = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=-(1 << 31),
        max_value=(1 << 31) - 1,
        help_text=f"Default {DEFAULT_TOP_K}; <= 0 disables it.",
    )
    max_tokens = StrictIntegerField(
        required=False,
        allow_null=True,
        help_text=f"Default {DEFAULT_MAX_TOKENS}; 0 or negative means "
        f"{NONPOSITIVE_MAX_TOKENS}; clamped to {MAX_TOKENS_CLAMP}. Wins over "
        "max_completion_tokens.",
    )
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True, help_text="Stop strings.")
    seed = StrictIntegerField(
        required=False, allow_null=True, help_text="With n > 1, choice i samples with seed + i."
    )
    n = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        help_text=f"Choices; more than {MAX_CHOICES} returns {MAX_CHOICES} with n_status "
        "capped_to_8.",
    )
    stream = StrictBooleanField(
        required=False, allow_null=True, help_text="true: an SSE stream (text/event-stream)."
    )
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    presence_penalty = StrictFloatField(
        required=False, allow_null=True, help_text="Clamped to [{:g}, {:g}].".format(*PENALTY_RANGE)
    )
    frequency_penalty = StrictFloatField(
        required=False, allow_null=True, help_text="Clamped to [{:g}, {:g}].".format(*PENALTY_RANGE)
    )
    repetition_penalty = StrictFloatField(
        required=False,
        allow_null=True,
        exclusive_min=0.0,
        max_value=REPETITION_PENALTY_MAX,
        error_messages={"not_greater": "must be greater than 0 (1 disables it)"},
        help_text="1 disables it.",
    )
    min_p = StrictFloatField(
        required=False, allow_null=True, help_text="Clamped to [{:g}, {:g}].".format(*MIN_P_RANGE)
    )
    logit_bias = LogitBiasField(
        required=False,
        allow_null=True,
        help_text='{"<token id>": bias}; bias clamped to [-100, 100]; non-numeric keys or '
        "values are skipped.",
    )
    logprobs = StrictBooleanField(required=False, allow_null=True)
    ignore_eos = StrictBooleanField(
        required=False,
        allow_null=True,
        help_text="llama.cpp's extension: true never draws the model's end-of-turn tokens, "
        "so the answer runs to max_tokens or a stop string.",
    )
    top_logprobs = StrictIntegerField(
        required=False,
        allow_null=True,
        help_text=f"Clamped to [0, {TOP_LOGPROBS_MAX}]; > 0 implies logprobs.",
    )
    response_format = serializers.DictField(
        required=False,
        allow_null=True,
        help_text='{"type": "text" | "json_object" | "json_schema", "json_schema": '
        '{"schema": ...}}.',
    )
    enable_thinking = StrictBooleanField(required=False, allow_null=True)
    reasoning_budget = StrictIntegerField(
        required=False,
        allow_null=True,
        help_text="0 or negative: unbounded. Alias max_reasoning_tokens.",
    )
    max_reasoning_tokens = StrictIntegerField(required=False, allow_null=True)
    reasoning_effort = EffortField()
    # OpenAI tools; their entries and tool_choice are checked in views._tools (the
    # dialect's parse_tools), which also decides the grammar.
    tools = BoundedListField(
        child=serializers.DictField(),
        required=False,
        allow_null=True,
        setting="PANTHEON_MAX_TOOLS",
        help_text='OpenAI tool definitions ({"type": "function", "function": {"name", '
        '"parameters"}}).',
    )
    tool_choice = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text='"auto" (default), "none", "required", or {"type": "function", '
        '"function": {"name": ...}}.',
    )
    # Speculative decoding: drafts never change the answer (wire/openai_chat/prediction.py).
    prediction = PredictionField()
    speculation = SpeculationField()
    priority = PriorityField()
    truncation = TruncationField()
    # Prefix-cache key, by precedence (then the X-Session-Id header): see session_key().
    session_id = StrictCharField(
        required=False,
        allow_null=True,
        max_length=SESSION_ID_MAX,
        help_text="Prefix-cache session key.",
    )
    prompt_cache_key = StrictCharField(required=False, allow_null=True, max_length=SESSION_ID_MAX)
    promptCacheKey = StrictCharField(  # noqa: N815
        required=False, allow_null=True, max_length=SESSION_ID_MAX
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
            presence_penalty=_clamp(_given(data, "presence_penalty", 0.0), *PENALTY_RANGE),
            frequency_penalty=_clamp(_given(data, "frequency_penalty", 0.0), *PENALTY_RANGE),
            repetition_penalty=_given(data, "repetition_penalty", 1.0),
            min_p=_clamp(_given(data, "min_p", 0.0), *MIN_P_RANGE),
            logit_bias=data.get("logit_bias") or (),
            logprobs=bool(data.get("logprobs")) or self.top_logprobs_clamped > 0,
            top_logprobs=self.top_logprobs_clamped,
            ignore_eos=bool(data.get("ignore_eos")),
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

    @property
    def top_logprobs_clamped(self) -> int:
        """`top_logprobs` clamped to [0, 20] (the contract); it implies `logprobs`."""
        return int(_clamp(_given(self.validated_data, "top_logprobs", 0), 0, TOP_LOGPROBS_MAX))

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.validated_data.get("logprobs")) or self.top_logprobs_clamped > 0

    def requested_reasoning_budget(self) -> int | None:
        """`reasoning_budget`, else its alias `max_reasoning_tokens`, else the one
        `reasoning_effort` implies; None: the model's."""
        data = self.validated_data
        value = data.get("reasoning_budget")
        value = value if value is not None else data.get("max_reasoning_tokens")
        effort = data.get("reasoning_effort")
        if value is None and effort is not None:
            return effort_thinking(effort)[1]
        return value

    def requested_thinking(self) -> bool | None:
        """`enable_thinking`, else what `reasoning_effort` implies; None: the server's."""
        data = self.validated_data
        value = data.get("enable_thinking")
        effort = data.get("reasoning_effort")
        if value is None and effort is not None:
            return effort_thinking(effort)[0]
        return value

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


def validated_chat_request(body: bytes) -> ChatCompletionRequest:
    request = ChatCompletionRequest(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request
