"""Strict JSON at the HTTP edge, shared by every app: the one body parser
(`parse_json_object`), the bounds on what a body may hold, DRF fields that do not coerce,
and DRF's error tree as one named 400.

The fields are strict about JSON types: DRF's stock fields coerce strings ("0.5", "yes"),
which would let a typo through as a value nobody asked for. `null` means "not given".
"""

from __future__ import annotations

import json
import math
import re

from django.conf import settings
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from pantheon_platform.errors import invalid_request

# Bounds on what a body may hold (README "Limits"); the body's byte size is bounded before
# it is read (pantheon_site/limits.py).
MAX_JSON_DEPTH = 64  # nested arrays/objects, the body's own object included
IDENTIFIER_MAX = 256  # model names, session ids, stop strings
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS = 1024  # entries
INT64_BOUND = 1 << 64  # integers beyond +-2**64 are refused, whatever the field
TEMPERATURE_RANGE = (-100.0, 100.0)  # <= 0 is greedy
REPETITION_PENALTY_MAX = 100.0
# The per-request `speculation` extension (chat, completions, Responses): "auto" lets the
# engine draft tokens and verify them (the same tokens as without), "off" never drafts.
SPECULATION_MODES = ("auto", "off")
# Context overflow (chat's `truncation` extension, Responses' `truncation`): "disabled"
# refuses a prompt past the window, "auto" drops the oldest turns to fit.
TRUNCATION_MODES = ("auto", "disabled")


class StrictCharField(serializers.CharField):
    """A JSON string. DRF's own lone-surrogate check walks the text a character at a time
    in Python, holding the GIL (a 2 MB /tokenize body: 62 ms, and a flood of them was the
    largest GIL holder in the process); the same check is made here at C speed."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.validators = [
            v for v in self.validators if not isinstance(v, ProhibitSurrogateCharactersValidator)
        ]

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        value = super().to_internal_value(data)
        char = _lone_surrogate(value)
        if char is not None:
            raise serializers.ValidationError(
                f"Surrogate characters are not allowed: U+{ord(char):X}.",
                code="surrogate_characters_not_allowed",
            )
        return value


class StrictFloatField(serializers.FloatField):
    """A finite JSON number (1e400 parses as infinity: refused). min_value/max_value give
    the field's range (DRF's validators, a 400 naming the bound)."""

    default_error_messages = {
        "out_of_range": "Must be a finite number (|value| < 2**64).",
        "not_greater": "Must be greater than {exclusive_min}.",
    }

    def __init__(self, *, exclusive_min: float | None = None, **kwargs):
        """exclusive_min: the value must be greater (min_value allows it equal)."""
        self.exclusive_min = exclusive_min
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, int) and abs(data) >= INT64_BOUND:
            self.fail("out_of_range")  # float(10**400) would raise OverflowError
        if not math.isfinite(data):
            self.fail("invalid")
        if self.exclusive_min is not None and data <= self.exclusive_min:
            self.fail("not_greater", exclusive_min=self.exclusive_min)
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


class SpeculationField(serializers.ChoiceField):
    """`speculation`: "auto" or "off" (a string; nothing else is read as one)."""

    default_error_messages = {
        "invalid_choice": 'expected "auto" or "off" (speculative decoding never changes '
        "the answer; off only stops the engine drafting)"
    }

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "help_text",
            'Extension: "auto" (the default) lets the engine draft tokens and verify them '
            'in one pass where the server allows it (PANTHEON_SPECULATION); "off" never '
            "drafts. The tokens generated are the same either way.",
        )
        super().__init__(SPECULATION_MODES, required=False, allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class PriorityField(serializers.ChoiceField):
    """`priority`: "interactive" (the default) or "batch" (engine.serving.priority)."""

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "help_text",
            'Extension: "batch" runs the request in the engine\'s batch class: it yields '
            "its slot to interactive requests (parked and resumed, its tokens unchanged). "
            '"interactive" (the default) is every live request\'s class.',
        )
        super().__init__(("interactive", "batch"), required=False, allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


class TruncationField(serializers.ChoiceField):
    """`truncation` (chat's extension, as Responses' field): "disabled" or "auto"."""

    default_error_messages = {"invalid_choice": 'expected "auto" or "disabled"'}

    def __init__(self, **kwargs):
        kwargs.setdefault(
            "help_text",
            'Extension (as the Responses API\'s field): "disabled" (the default) refuses a '
            'prompt past the context window (400 context_length_exceeded); "auto" drops the '
            "oldest turns (never the system messages or the latest user message on) to fit, "
            "leaving the answer max_tokens (at most a quarter of the window), and says how "
            "many messages went in usage.truncated_messages.",
        )
        super().__init__(TRUNCATION_MODES, required=False, allow_null=True, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


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

    def openapi_schema(self) -> dict:
        text = {"type": "string", "maxLength": IDENTIFIER_MAX}
        return {"anyOf": [text, {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": text}]}


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

    def openapi_schema(self) -> dict:
        return {"type": "object", "maxProperties": MAX_LOGIT_BIAS, "additionalProperties": True}


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


def json_kind(value: object) -> str:
    """A parsed JSON value's kind, as error messages name it ("null", "array", ...)."""
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
        type(value), "array" if isinstance(value, list) else "object"
    )


def tool_objects(value: object) -> list[tuple[str, dict]]:
    """A request's `tools` as (path, tool object) pairs ("tools.0", ...): absent is none;
    else a JSON array of at most PANTHEON_MAX_TOOLS objects, or a 400 naming the field.
    What each tool holds is the wire format's to check."""
    from django.conf import settings

    from pantheon_platform.errors import invalid_request

    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_request(f"tools: expected an array, got {json_kind(value)}", "tools")
    limit = settings.PANTHEON_MAX_TOOLS
    if len(value) > limit:
        raise invalid_request(
            f"tools: at most {limit} tools (PANTHEON_MAX_TOOLS); got {len(value)}", "tools"
        )
    pairs = []
    for i, tool in enumerate(value):
        path = f"tools.{i}"
        if not isinstance(tool, dict):
            raise invalid_request(f"{path}: expected an object, got {json_kind(tool)}", path)
        pairs.append((path, tool))
    return pairs
