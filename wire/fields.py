"""Request fields declared once: the Ollama, Anthropic and Responses bodies are tables of
fields, and each field both checks a JSON value (in its format's wording) and describes
itself as a JSON Schema fragment, so /openapi.json shows the bounds the parser enforces.

A field's kind is a scalar (String, Boolean, Integer, Number), an Object of fields, an
Array, AnyOf several shapes, or a Shape: a schema written out. The last four may carry
the format's own reader (a conversation, a tool list: what the format maps, not just
checks). A field that is absent or null reads as its default; "required" is the
schema's word, each format saying in its own words what is missing. A table is read in
its order or field by field, so the first fault answered stays the one it always was.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings

from pantheon_platform.errors import ApiError, invalid_request
from pantheon_platform.openapi import nullable
from pantheon_platform.strict_json import IDENTIFIER_MAX, INT64_BOUND, MAX_STOP_STRINGS, json_kind

# A reasoning effort (Responses' reasoning.effort, chat's reasoning_effort) -> (thinking
# on?, reasoning budget in tokens; 0: no budget). "none" and "minimal" turn thinking off;
# the others bound the think block, "max" not at all.
EFFORT_BUDGETS: dict[str, tuple[bool, int]] = {
    "none": (False, 0),
    "minimal": (False, 0),
    "low": (True, 512),
    "medium": (True, 2048),
    "high": (True, 8192),
    "xhigh": (True, 16384),
    "max": (True, 0),
}


def effort_thinking(effort: str) -> tuple[bool, int | None]:
    """(thinking on?, its reasoning budget: None where thinking is off) for an effort."""
    thinking, budget = EFFORT_BUDGETS[effort]
    return thinking, budget if thinking else None


# One free-form text of a request (a message's content, a tool's description, a call's
# arguments, a description that only rides along): at most this many characters, whether
# or not the template puts it in the prompt. About a million tokens: longer than any
# window a model here is served with, so no prompt that could fit is refused by it.
TEXT_MAX = 4 * 2**20


@dataclass(frozen=True)
class Wording:
    """How a wire format words a refused value; each keeps the messages its clients
    already see (Ollama and Anthropic name the JSON kind that came, Responses does not)."""

    says_kind: bool = True  # "expected a string, got number"
    number_magnitude: bool = False  # |x| < 2**64 checked before a number's range
    number_range: str = "must be between {low:g} and {high:g}"
    non_finite: str | None = "expected a finite number"  # None: the range message
    integer_range_split: bool = False  # "must be at least 1" / "must be at most 20" apart

    def wrong_type(self, path: str, expected: str, value: object) -> ApiError:
        got = f", got {json_kind(value)}" if self.says_kind else ""
        return invalid_request(f"{path}: expected {expected}{got}", path)


# The wording each format has always used.
OLLAMA = Wording(number_magnitude=True)
ANTHROPIC = Wording()
RESPONSES = Wording(
    says_kind=False,
    number_range="expected a number in [{low:g}, {high:g}]",
    non_finite=None,
    integer_range_split=True,
)


class Kind:
    """What a field holds: how a non-null value is read, and its schema."""

    def read(self, value: object, path: str, wording: Wording) -> object:
        return value

    def schema(self) -> dict:
        raise NotImplementedError


@dataclass(frozen=True)
class Shape(Kind):
    """A schema written out, read by `reader(value, path)` when one is given (else the
    value is passed on as is, for the format's code to read)."""

    shape: dict
    reader: Callable[[object, str], object] | None = None

    def read(self, value, path, wording):
        return value if self.reader is None else self.reader(value, path)

    def schema(self) -> dict:
        return copy.deepcopy(self.shape)


@dataclass(frozen=True)
class Boolean(Kind):
    def read(self, value, path, wording):
        if not isinstance(value, bool):
            raise wording.wrong_type(path, "a boolean", value)
        return value

    def schema(self) -> dict:
        return {"type": "boolean"}


@dataclass(frozen=True)
class String(Kind):
    max_length: int | None = None
    min_length: int | None = None  # the schema's: an empty string is each format's call

    def read(self, value, path, wording):
        if not isinstance(value, str):
            raise wording.wrong_type(path, "a string", value)
        if self.max_length is not None and len(value) > self.max_length:
            raise invalid_request(f"{path}: at most {self.max_length} characters", path)
        return value

    def schema(self) -> dict:
        out: dict = {"type": "string"}
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        return out


@dataclass(frozen=True)
class Integer(Kind):
    """A 64-bit integer (|value| < 2**64; a whole float such as 2.0 reads as 2), within
    [low, high] when given."""

    low: int | None = None
    high: int | None = None
    out_of_range: str | None = None  # the range message, when the format words it its way

    def read(self, value, path, wording):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise wording.wrong_type(path, "an integer", value)
        if abs(value) >= INT64_BOUND:
            raise invalid_request(f"{path}: must be a 64-bit integer (|value| < 2**64)", path)
        below = self.low is not None and value < self.low
        above = self.high is not None and value > self.high
        if below or above:
            raise invalid_request(f"{path}: {self._range_message(below, wording)}", path)
        return value

    def _range_message(self, below: bool, wording: Wording) -> str:
        if self.out_of_range is not None:
            return self.out_of_range
        if self.low is not None and (below or not wording.integer_range_split):
            if self.high is not None and not wording.integer_range_split:
                return f"must be between {self.low} and {self.high}"
            return f"must be at least {self.low}"
        return f"must be at most {self.high}"

    def schema(self) -> dict:
        return {
            "type": "integer",
            "minimum": 1 - INT64_BOUND if self.low is None else self.low,
            "maximum": INT64_BOUND - 1 if self.high is None else self.high,
        }


@dataclass(frozen=True)
class Number(Kind):
    """A finite number, read as a float, within [low, high] (or (above, high]) when given;
    unbounded, the schema says |value| < 2**64."""

    low: float | None = None
    high: float | None = None
    above: float | None = None  # an exclusive lower bound, instead of `low`
    out_of_range: str | None = None

    def read(self, value, path, wording):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wording.wrong_type(path, "a number", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid_request(f"{path}: {wording.non_finite or self._range(wording)}", path)
        if wording.number_magnitude and abs(value) >= INT64_BOUND:
            raise invalid_request(f"{path}: must be below 2**64 in magnitude", path)
        if not self._within(value):
            raise invalid_request(f"{path}: {self.out_of_range or self._range(wording)}", path)
        return float(value)

    def _within(self, value) -> bool:
        if self.above is not None and value <= self.above:
            return False
        if self.low is not None and value < self.low:
            return False
        return self.high is None or value <= self.high

    def _range(self, wording: Wording) -> str:
        return wording.number_range.format(low=self.low, high=self.high)

    def schema(self) -> dict:
        if self.low is None and self.high is None and self.above is None:
            return {
                "type": "number",
                "exclusiveMinimum": -INT64_BOUND,
                "exclusiveMaximum": INT64_BOUND,
            }
        out: dict = {"type": "number"}
        if self.above is not None:
            out["exclusiveMinimum"] = self.above
        if self.low is not None:
            out["minimum"] = self.low
        if self.high is not None:
            out["maximum"] = self.high
        return out


@dataclass(frozen=True)
class Array(Kind):
    """An array: its bound may be a setting's name, read when the schema is made (tests
    change settings). It is read by `reader(value, path)`, the format's (what an array
    holds is mapped, and each format words its own limits); without one, passed on."""

    items: Kind | dict | None = None
    max_items: int | str | None = None
    min_items: int | None = None
    reader: Callable[[object, str], object] | None = None

    def read(self, value, path, wording):
        return value if self.reader is None else self.reader(value, path)

    def schema(self) -> dict:
        out: dict = {"type": "array"}
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            bound = self.max_items
            out["maxItems"] = getattr(settings, bound) if isinstance(bound, str) else bound
        if self.items is not None:
            items = self.items
            out["items"] = items.schema() if isinstance(items, Kind) else copy.deepcopy(items)
        return out


@dataclass(frozen=True)
class AnyOf(Kind):
    """One of several shapes (a string or an array of items, ...), read by the format's
    `reader(value, path)` when given."""

    options: tuple[Kind | dict, ...]
    reader: Callable[[object, str], object] | None = None

    def read(self, value, path, wording):
        return value if self.reader is None else self.reader(value, path)

    def schema(self) -> dict:
        return {
            "anyOf": [o.schema() if isinstance(o, Kind) else copy.deepcopy(o) for o in self.options]
        }


@dataclass(frozen=True)
class Field:
    """One member of a body: its name, kind, and how the schema shows it."""

    name: str
    kind: Kind
    required: bool = False  # in the schema's `required` list
    nullable: bool = True  # the schema allows null (an absent field reads the same)
    description: str | None = None
    default: object = None

    def read(self, value: object, path: str, wording: Wording) -> object:
        if value is None:
            return self.default
        return self.kind.read(value, path, wording)

    def schema(self) -> dict:
        out = self.kind.schema()
        if self.description is not None:
            out["description"] = self.description
        return nullable(out) if self.nullable else out


class Table:
    """A body's (or a nested object's) fields, in the order they are checked."""

    def __init__(self, *fields: Field, wording: Wording | None = None):
        self.fields = fields
        self.wording = wording or Wording()

    def __add__(self, other: Table) -> Table:
        return Table(*self.fields, *other.fields, wording=self.wording)

    def __getitem__(self, name: str) -> Field:
        for entry in self.fields:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def without(self, *names: str) -> Table:
        return Table(*(f for f in self.fields if f.name not in names), wording=self.wording)

    def value(self, data: dict, name: str, prefix: str = "") -> object:
        """`data[name]` read by its field (the path in messages is prefix + name)."""
        return self[name].read(data.get(name), prefix + name, self.wording)

    def read(self, data: dict, prefix: str = "") -> dict[str, object]:
        """Every field of `data`, read in the table's order."""
        return {
            f.name: f.read(data.get(f.name), prefix + f.name, self.wording) for f in self.fields
        }

    def schema(self, **extra) -> dict:
        """The object schema: the fields' properties, the required ones, and `extra`
        (additionalProperties, description, ...)."""
        out: dict = {"type": "object", "properties": {f.name: f.schema() for f in self.fields}}
        out.update(extra)
        required = [f.name for f in self.fields if f.required]
        if required:
            out["required"] = required
        return out


@dataclass(frozen=True)
class Object(Kind):
    """A nested object of fields: read checks it is an object, then hands it to
    `reader(value, path)` when given, else (`nested`) reads its fields into a dict, else
    returns it as is, for its fields to be read later."""

    table: Table
    additional: bool | None = None  # the schema's additionalProperties, when it says
    nested: bool = True
    reader: Callable[[dict, str], object] | None = None

    def read(self, value, path, wording):
        if not isinstance(value, dict):
            raise wording.wrong_type(path, "an object", value)
        if self.reader is not None:
            return self.reader(value, path)
        return self.table.read(value, prefix=f"{path}.") if self.nested else value

    def schema(self) -> dict:
        extra = {} if self.additional is None else {"additionalProperties": self.additional}
        return self.table.schema(**extra)


def stop_strings(value: object, path: str) -> tuple[str, ...]:
    """A `stop` member (Ollama's options.stop, llama.cpp's stop): one string or at most
    MAX_STOP_STRINGS of them, each at most IDENTIFIER_MAX characters; empty ones dropped."""
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
