"""What the text routes share: JSON in (strict fields), token-id inputs, the model."""

from __future__ import annotations

from rest_framework import serializers

from pantheon_platform.strict_json import IDENTIFIER_MAX, StrictCharField

TOKEN_ID_MAX = (1 << 31) - 1  # past any vocabulary; the model's own bound is checked later


def is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= TOKEN_ID_MAX


def token_list(value: object) -> tuple[int, ...] | None:
    """`value` as token ids, or None when it is not a non-empty array of them."""
    if isinstance(value, list) and value and all(is_token_id(v) for v in value):
        return tuple(value)
    return None


def text_inputs(value: object, what: str, limit: int) -> list[str | tuple[int, ...]]:
    """OpenAI's input forms: a string, an array of strings, an array of token ids, or an
    array of arrays of token ids; at most `limit` inputs. Raises ValidationError."""
    expected = (
        f"expected a string, an array of strings, an array of token ids or an array of "
        f"arrays of token ids (ids are integers >= 0); at most {limit} {what}"
    )
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise serializers.ValidationError(expected)
    ids = token_list(value)  # one input of token ids: its length counts tokens
    if ids is not None:
        return [ids]
    if len(value) > limit:
        raise serializers.ValidationError(f"at most {limit} {what}; got {len(value)}")
    if all(isinstance(v, str) for v in value):
        return list(value)
    lists = [token_list(v) for v in value]
    if all(ids is not None for ids in lists):
        return lists
    raise serializers.ValidationError(expected)


class ModelField(StrictCharField):
    def __init__(self, **kwargs):
        super().__init__(
            required=False, allow_null=True, allow_blank=True, max_length=IDENTIFIER_MAX, **kwargs
        )
