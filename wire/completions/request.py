"""POST /v1/completions' request: the fields (strict JSON), their bounds, and what the
view reads of them (the prompts, the sampling, echo, logprobs, streaming)."""

from __future__ import annotations

from rest_framework import serializers

from engine import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_CHOICES,
    MAX_TOKENS_CLAMP,
    SamplingParams,
)
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    LogitBiasField,
    PriorityField,
    SpeculationField,
    StopField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    invalid_errors,
    parse_json_object,
)
from wire.completions.common import ModelField, text_inputs
from wire.openai_chat.request import StreamOptionsSerializer

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 64
MAX_LOGPROBS = 20  # OpenAI takes 0..5; alternatives per token, as top_logprobs on chat


class CompletionRequest(serializers.Serializer):
    """POST /v1/completions. Unknown fields are ignored."""

    model = ModelField()
    prompt = serializers.JSONField()
    suffix = serializers.JSONField(required=False, allow_null=True)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0)
    temperature = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=TEMPERATURE_RANGE[0],
        max_value=TEMPERATURE_RANGE[1],
    )
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    top_k = StrictIntegerField(
        required=False, allow_null=True, min_value=-(1 << 31), max_value=(1 << 31) - 1
    )
    min_p = StrictFloatField(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CHOICES)
    best_of = StrictIntegerField(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    logprobs = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_LOGPROBS
    )
    echo = StrictBooleanField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = StrictIntegerField(required=False, allow_null=True)
    presence_penalty = StrictFloatField(required=False, allow_null=True)
    frequency_penalty = StrictFloatField(required=False, allow_null=True)
    repetition_penalty = StrictFloatField(
        required=False, allow_null=True, max_value=REPETITION_PENALTY_MAX
    )
    logit_bias = LogitBiasField(required=False, allow_null=True)
    ignore_eos = StrictBooleanField(
        required=False,
        allow_null=True,
        help_text="llama.cpp's extension: true never draws the model's end-of-turn tokens.",
    )
    user = StrictCharField(required=False, allow_null=True, allow_blank=True)
    session_id = StrictCharField(required=False, allow_null=True, max_length=IDENTIFIER_MAX)
    speculation = SpeculationField()
    priority = PriorityField()

    def validate_prompt(self, value):
        return text_inputs(value, "prompts", MAX_PROMPTS)

    def validate_suffix(self, value):
        if value not in (None, ""):
            raise serializers.ValidationError(
                "not supported: this server does not fill in the middle (send no suffix)"
            )
        return value

    def validate_repetition_penalty(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than 0 (1 disables it)")
        return value

    def validate(self, attrs):
        best_of, n = attrs.get("best_of"), attrs.get("n") or 1
        if best_of is not None and best_of != n:
            raise serializers.ValidationError(
                {
                    "best_of": [
                        f"not supported unless equal to n ({n}): this server returns every "
                        "choice it generates; ask for n choices instead"
                    ]
                }
            )
        return attrs

    # --- what the view reads ---

    @property
    def prompts(self) -> list[str | tuple[int, ...]]:
        return self.validated_data["prompt"]

    @property
    def n_choices(self) -> int:
        return self.validated_data.get("n") or 1

    @property
    def tokens_wanted(self) -> int:
        value = self.validated_data.get("max_tokens")
        return DEFAULT_MAX_TOKENS if value is None else min(value, MAX_TOKENS_CLAMP)

    @property
    def top_wanted(self) -> int | None:
        return self.validated_data.get("logprobs")

    @property
    def wants_echo(self) -> bool:
        return bool(self.validated_data.get("echo"))

    @property
    def is_stream(self) -> bool:
        return bool(self.validated_data.get("stream"))

    @property
    def wants_usage(self) -> bool:
        return bool((self.validated_data.get("stream_options") or {}).get("include_usage"))

    def sampling_params(self) -> SamplingParams:
        data = self.validated_data

        def given(key, default):
            value = data.get(key)
            return default if value is None else value

        return SamplingParams(
            temperature=given("temperature", DEFAULT_TEMPERATURE),
            top_k=given("top_k", DEFAULT_TOP_K),
            top_p=given("top_p", DEFAULT_TOP_P),
            max_tokens=max(1, self.tokens_wanted),  # 0 is answered without generating
            stop=data.get("stop") or (),
            seed=data.get("seed"),
            presence_penalty=max(-2.0, min(2.0, given("presence_penalty", 0.0))),
            frequency_penalty=max(-2.0, min(2.0, given("frequency_penalty", 0.0))),
            repetition_penalty=given("repetition_penalty", 1.0),
            min_p=max(0.0, min(1.0, given("min_p", 0.0))),
            logit_bias=data.get("logit_bias") or (),
            logprobs=self.top_wanted is not None,
            top_logprobs=self.top_wanted or 0,
            ignore_eos=bool(data.get("ignore_eos")),
        )


def validated(body: bytes) -> CompletionRequest:
    request = CompletionRequest(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request
