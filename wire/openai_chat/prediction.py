"""OpenAI's Predicted Outputs at the HTTP edge: `prediction` checked and read as text.

`{"type": "content", "content": "..."}`, the content a string or an array of text parts
(`{"type": "text", "text": "..."}`, joined). The text only gives the engine tokens to draft
from (exact speculative decoding): the answer is the same with or without it, and
usage.completion_tokens_details says how many of its tokens were accepted and rejected.
"""

from __future__ import annotations

from rest_framework import serializers

from pantheon_platform.strict_json import json_kind

# Characters of prediction text (the parts together). The engine drafts from at most a
# context window's worth of tokens, so past this nothing more could be used.
PREDICTION_MAX_CHARS = 1 << 20
PREDICTION_MAX_PARTS = 1024
PREDICTION_TYPES = ("content",)


class PredictionField(serializers.Field):
    """`prediction`: {"type": "content", "content": string | [text parts]}, read as the
    predicted text. A fault is a 400 naming the member at fault
    (`prediction.type`, `prediction.content[2].text`)."""

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "help_text",
            "OpenAI Predicted Outputs: text the answer is expected to match (e.g. the file "
            "being edited). Drafted from by speculative decoding: the answer is the same "
            "without it; usage.completion_tokens_details counts the accepted and rejected "
            f"prediction tokens. At most {PREDICTION_MAX_CHARS} characters.",
        )
        super().__init__(required=False, allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                'expected an object like {"type": "content", "content": "..."}'
            )
        kind = data.get("type")
        if kind not in PREDICTION_TYPES:
            raise serializers.ValidationError({"type": [f'expected "content", got {_shown(kind)}']})
        text = _content_text(data.get("content"))
        if len(text) > PREDICTION_MAX_CHARS:
            raise serializers.ValidationError(
                {"content": [f"at most {PREDICTION_MAX_CHARS} characters; got {len(text)}"]}
            )
        return text

    def to_representation(self, value):
        return {"type": "content", "content": value or ""}

    def openapi_schema(self) -> dict:
        part = {
            "type": "object",
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
            "required": ["type", "text"],
        }
        return {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": list(PREDICTION_TYPES)},
                "content": {
                    "anyOf": [
                        {"type": "string", "maxLength": PREDICTION_MAX_CHARS},
                        {"type": "array", "maxItems": PREDICTION_MAX_PARTS, "items": part},
                    ]
                },
            },
            "required": ["type", "content"],
        }


def _content_text(content: object) -> str:
    """`prediction.content` as one text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise serializers.ValidationError(
            {"content": ["expected a string or an array of text parts"]}
        )
    if len(content) > PREDICTION_MAX_PARTS:
        raise serializers.ValidationError(
            {"content": [f"at most {PREDICTION_MAX_PARTS} parts; got {len(content)}"]}
        )
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise serializers.ValidationError(
                {"content": {i: ['expected a text part {"type": "text", "text": "..."}']}}
            )
        if part.get("type") != "text":
            why = f'expected "text" (only text parts are taken), got {_shown(part.get("type"))}'
            raise serializers.ValidationError({"content": {i: {"type": [why]}}})
        text = part.get("text")
        if not isinstance(text, str):
            raise serializers.ValidationError({"content": {i: {"text": ["Must be a string."]}}})
        texts.append(text)
    return "".join(texts)


def _shown(value: object) -> str:
    """A refused `type` as the message names it: a short string quoted, else its kind."""
    if isinstance(value, str):
        return repr(value[:40])
    return json_kind(value)
