"""What tool calling deals in: the offered tools (ToolSpec, parsed from OpenAI `tools`),
the calls and errors a parse yields, the events it streams, and a parameter's raw text
typed by its JSON schema. Shared by every dialect."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict


def parse_tools(tools: list[dict]) -> list[ToolSpec]:
    """OpenAI `tools` entries -> ToolSpecs; ValueError naming the bad entry."""
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object")
        if entry.get("type", "function") != "function":
            raise ValueError(f"{where}.type must be 'function'")
        fn = entry.get("function")
        if not isinstance(fn, dict):
            raise ValueError(f"{where}.function must be an object")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"{where}.function.name must be 1-64 of [A-Za-z0-9_.-]")
        if name in seen:
            raise ValueError(f"{where}.function.name {name!r} is given twice")
        seen.add(name)
        description = fn.get("description", "")
        if description is None:
            description = ""
        if not isinstance(description, str):
            raise ValueError(f"{where}.function.description must be a string")
        parameters = fn.get("parameters", _EMPTY_PARAMETERS)
        if not isinstance(parameters, dict):
            raise ValueError(f"{where}.function.parameters must be an object (a JSON schema)")
        specs.append(ToolSpec(name, description, parameters))
    return specs


# --- parse results and stream events ------------------------------------------------------


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class CallError:
    code: str  # incomplete_call | malformed_call | unknown_function | invalid_argument
    message: str
    function: str | None = None
    parameter: str | None = None


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallOpened:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


@dataclass(frozen=True)
class CallClosed:
    index: int
    call: ParsedCall


Event = TextDelta | CallOpened | ArgumentsDelta | CallClosed


# --- arguments typed from the schema ----------------------------------------------------------


def schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    t = schema.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            types += [x for x in schema_types(sub) if x not in types]
    return types


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


def _coerce_as(text: str, t: str) -> Any:
    s = text.strip()
    if t == "string":
        return text
    if t == "null":
        if s in ("null", "None"):
            return None
    elif t == "boolean":
        if s.lower() in ("true", "false"):
            return s.lower() == "true"
    elif t in ("integer", "number"):
        try:
            v = loads_strict(s)
        except ValueError:
            v = None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            if t == "number":
                return v
            if isinstance(v, int) or v.is_integer():
                return int(v)
    elif t in ("object", "array"):
        try:
            v = loads_strict(s)
        except ValueError:
            v = None
        if isinstance(v, dict if t == "object" else list):
            return v
    raise ValueError(f"{s[:40]!r} is not a valid {t}")


def coerce_text(text: str, schema: Any) -> Any:
    """A parameter's raw text typed by its schema (a string when the schema gives no type).
    ValueError when no listed type fits."""
    types = schema_types(schema)
    if not types or "string" in types and len(types) == 1:
        return text
    order = ["null", "boolean", "integer", "number", "object", "array"]
    last: ValueError | None = None
    for t in sorted(types, key=lambda t: order.index(t) if t in order else len(order)):
        try:
            return _coerce_as(text, t)
        except ValueError as e:
            last = e
    raise last or ValueError(f"{text[:40]!r} fits none of {types}")
