"""Request validation for the operator routes: JSON in, runtime.LoadSpec out.

Strict about JSON types (the client routes' fields): "4" is not a number here either.
"""

from __future__ import annotations

from rest_framework import serializers

from pantheon_platform.runtime import (
    KV_DTYPES,
    MAX_CHAT_TEMPLATE_BYTES,
    MAX_DIES,
    POOLINGS,
    LoadSpec,
    default_options,
)
from pantheon_platform.strict_json import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    parse_json_object,
)

NAME_MAX = 200  # operators.models: the served name's column


def validated(serializer_class, raw: bytes) -> dict:
    """The body (the client routes' parser: a JSON object, bounded nesting, whatever the
    Content-Type says, so curl -d works) through `serializer_class`."""
    serializer = serializer_class(data=parse_json_object(raw))
    serializer.is_valid(
        raise_exception=True
    )  # DRF's ValidationError -> 400 (pantheon_platform.errors)
    return serializer.validated_data


def _option(max_value: int):
    return StrictIntegerField(required=False, allow_null=True, min_value=0, max_value=max_value)


class NameField(StrictCharField):
    def __init__(self, **kwargs):
        super().__init__(max_length=NAME_MAX, trim_whitespace=True, **kwargs)


class LoadRequest(serializers.Serializer):
    """POST /admin/models/load."""

    path = StrictCharField(
        max_length=4096,
        help_text="A GGUF file inside PANTHEON_MODEL_DIRS (a relative path is looked up in them).",
    )
    name = NameField(
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="Served name; default: the file name.",
    )
    dies = serializers.ListField(
        child=StrictIntegerField(min_value=0, max_value=1 << 16),  # die indices
        required=False,
        allow_null=True,
        max_length=MAX_DIES,
        error_messages={"max_length": f"too many dies: at most {MAX_DIES}"},
    )
    quantize = StrictBooleanField(required=False, allow_null=True)
    pooling = serializers.ChoiceField(
        POOLINGS,
        required=False,
        allow_null=True,
        help_text="How /v1/embeddings pools hidden states; default: the architecture's "
        "(mean; last for gemma3).",
    )
    draft_model = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=4096,
        help_text="Speculative decoding's draft model: a GGUF with the same vocabulary, "
        "inside PANTHEON_MODEL_DIRS; default: none (drafts from the context only).",
    )
    kv_dtype = serializers.ChoiceField(
        KV_DTYPES,
        required=False,
        allow_null=True,
        help_text="What the KV cache stores keys and values as: f32 (exact, the default), "
        "f16 (half the memory) or q8_0 (~3.8x less); the narrow types move the logits a "
        "little (README: Load options).",
    )
    ctx_cap = _option(1 << 24)
    max_sessions = _option(1024)
    max_concurrent = _option(1024)
    reasoning_budget = _option(1 << 24)
    pinned = StrictBooleanField(required=False, allow_null=True)
    # llama.cpp's --chat-template-file, or the text itself
    chat_template = StrictCharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        trim_whitespace=False,
        max_length=MAX_CHAT_TEMPLATE_BYTES,
        help_text="A template's text, or a file inside the model folders.",
    )


def load_spec(data: dict) -> LoadSpec:
    """A LoadSpec from validated fields: 0 or absent options take the server's defaults,
    a missing name is the file name without `.gguf`."""
    from pathlib import Path

    defaults = default_options()
    name = data.get("name") or Path(data["path"]).name.removesuffix(".gguf")
    return LoadSpec.of(
        name=name,
        path=data["path"],
        dies=tuple(data.get("dies") or ()),
        quantize=bool(data.get("quantize")),
        pinned=bool(data.get("pinned")),
        chat_template=data.get("chat_template") or "",
        pooling=data.get("pooling") or "",
        draft_model=data.get("draft_model") or "",
        kv_dtype=data.get("kv_dtype") or "f32",
        **{key: data.get(key) or defaults[key] for key in defaults},
    )


class NameRequest(serializers.Serializer):
    """POST /admin/models/unload."""

    name = NameField()


class PinRequest(serializers.Serializer):
    name = NameField()
    pinned = StrictBooleanField()


class AliasRequest(serializers.Serializer):
    """POST /admin/aliases. `model` is accepted for `target` (the Lemonade spelling)."""

    alias = NameField()
    target = NameField(required=False)
    model = NameField(required=False, help_text="Accepted for target.")

    def validate(self, attrs):
        attrs["target"] = attrs.get("target") or attrs.get("model")
        if not attrs["target"]:
            raise serializers.ValidationError({"target": "This field is required."})
        return attrs
