"""A request's `response_format`, compiled once (no model needed) into a `ConstraintPlan`:
the llguidance grammar that masks tokens while decoding, and the schema (its objects
closed) the final answer is checked against (engine.decoding.schema_check)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema
import llguidance

from engine.decoding.schema_check import _validator_class

JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

# Each run of JSON whitespace is capped (llguidance matches the pattern once per place
# whitespace may go): room for pretty-printed output, but a model cannot loop on newlines.
WHITESPACE_PATTERN = r"[\x20\x0A\x0D\x09]{1,64}"
# "\u00f6" is as valid in a JSON string as "ö", and json.dumps-trained models write it.
_COMPILE_DEFAULTS = {
    "whitespace_pattern": WHITESPACE_PATTERN,
    "json_allow_general_unicode_escapes": True,
}
# A schema's own "x-guidance" may not switch on llguidance's silent approximations.
_STRICT = {"lenient": False, "coerce_one_of": False}
_LENIENT = {"lenient": True}


@dataclass(frozen=True)
class ConstraintPlan:
    """What a request's response_format compiles to, once per request.

    status: "applied" | "schema_downgraded" | "ignored_unknown_type" | "text".
    grammar: llguidance's top-level grammar (JSON text); None = unconstrained.
    schema: what the final content is validated against: the client's own schema (its
    objects closed, see closed_objects), also when downgraded (so a value breaking the
    dropped feature fails validation).
    """

    status: str
    message: str = ""
    grammar: str | None = None
    schema: dict | None = None


TEXT_PLAN = ConstraintPlan("text")


def _compile(schema: dict, overrides: dict) -> tuple[str, bool, list[str]]:
    """(grammar, is_error, llguidance's errors or warnings) for a JSON schema."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults=_COMPILE_DEFAULTS, overrides=overrides
    )
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return grammar, is_error, messages


def _type_only(schema: dict) -> dict:
    """The nearest always-enforceable schema: the root's declared type(s), else an object."""
    kind = schema.get("type")
    if isinstance(kind, str) and kind in JSON_TYPES:
        return {"type": kind}
    if isinstance(kind, list) and kind and all(k in JSON_TYPES for k in kind):
        return {"type": kind}
    return dict(JSON_OBJECT_SCHEMA)


# --- objects closed by default ---------------------------------------------------------
#
# An object schema that lists `properties` and says nothing of `additionalProperties` (or
# `unevaluatedProperties`) admits any other key by JSON Schema's letter, and a model held
# to it kept adding keys until `length`. Like llama.cpp and vLLM, the grammar and the
# final check read a missing `additionalProperties` as false, at every nesting level; an
# explicit value (true, a schema) is kept. Subschemas that describe one object together
# (an `allOf` of several parts, `anyOf`/`oneOf`/`$ref` beside `properties`) are closed as
# a whole: the object may hold the keys any of its parts names, and no other.

# ("not" is left as it is: closing what it negates would widen the schema.)
_SUBSCHEMA = ("additionalProperties", "unevaluatedProperties", "propertyNames", "if", "then")
_SUBSCHEMA += ("else", "contains", "additionalItems", "unevaluatedItems")
_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_KEYS = ("additionalProperties", "unevaluatedProperties", "patternProperties")


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` with `additionalProperties: false` on every object schema that
    lists `properties` and leaves additional ones unsaid (see above); `schema` itself is
    not changed."""
    if not isinstance(schema, dict):
        return schema
    keep_open: set[int] = set()  # ids of the parts of shared objects (nodes of `schema`)
    _mark_parts(schema, schema, keep_open, 0)
    return _close(schema, schema, keep_open)


def _resolve(root: dict, ref: str) -> Any:
    """The node a local `$ref` ("#/$defs/x") points to in `root`, else None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for key in filter(None, ref[1:].split("/")):
        key = key.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return None
    return node


def _parts(root: dict, node: dict) -> list[Any]:
    """The subschemas that apply to the same instance as `node`'s own keywords (a `$ref`
    part also as the node it points to; None where that cannot be resolved)."""
    parts = [s for k in ("allOf", "anyOf", "oneOf") for s in _list(node.get(k))]
    parts += [node[k] for k in ("if", "then", "else") if k in node]
    dependent = node.get("dependentSchemas")
    parts += list(dependent.values()) if isinstance(dependent, dict) else []
    if isinstance(node.get("$ref"), str):
        parts.append(_resolve(root, node["$ref"]))
    for part in list(parts):
        if isinstance(part, dict) and part is not node and isinstance(part.get("$ref"), str):
            parts.append(_resolve(root, part["$ref"]))
    return parts


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _shared(node: dict) -> bool:
    """`node` and its parts describe one object together (else a lone anyOf's or oneOf's
    branches are each an object of its own)."""
    together = len(_list(node.get("allOf"))) + isinstance(node.get("$ref"), str)
    together += sum(k in node for k in ("anyOf", "oneOf", "if", "dependentSchemas"))
    return isinstance(node.get("properties"), dict) or together >= 2


def _keep(root: dict, part: Any, keep_open: set[int], depth: int) -> None:
    if not isinstance(part, dict) or id(part) in keep_open or depth > 64:
        return
    keep_open.add(id(part))
    for sub in _parts(root, part):  # a part's own parts describe the same object too
        _keep(root, sub, keep_open, depth + 1)


def _mark_parts(root: dict, node: Any, keep_open: set[int], depth: int) -> None:
    """Put the ids of the subschemas that are parts of a shared object in `keep_open`."""
    if depth > 64:
        return
    if isinstance(node, dict):
        if _shared(node):
            for part in _parts(root, node):
                _keep(root, part, keep_open, 0)
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            if isinstance(item, dict | list):
                _mark_parts(root, item, keep_open, depth + 1)


def _names(root: dict, part: Any, depth: int = 0) -> set[str] | None:
    """The property names a part of a shared object lists; None when it admits others."""
    if isinstance(part, bool):
        return set()
    if not isinstance(part, dict) or depth > 32:
        return None
    if any(part.get(k) not in (None, False) for k in _OPEN_KEYS):
        return None
    names = set(part.get("properties") or {})
    for sub in _parts(root, part):
        more = _names(root, sub, depth + 1)
        if more is None:
            return None
        names |= more
    return names


def _close(root: dict, node: Any, keep_open: set[int]) -> Any:
    if isinstance(node, list):
        return [_close(root, item, keep_open) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _SUBSCHEMAS and isinstance(value, dict):
            out[key] = {k: _close(root, v, keep_open) for k, v in value.items()}
        elif key in _SUBSCHEMA or key in ("items", "prefixItems", "allOf", "anyOf", "oneOf"):
            out[key] = _close(root, value, keep_open)
        else:
            out[key] = value
    unsaid = "additionalProperties" not in node and "unevaluatedProperties" not in node
    if not unsaid or id(node) in keep_open:
        return out
    if not _shared(node):
        if isinstance(node.get("properties"), dict):
            out["additionalProperties"] = False
        return out
    names: set[str] | None = set(node.get("properties") or {})
    for part in _parts(root, node):
        more = _names(root, part)
        names = None if more is None or names is None else names | more
    if names is not None:
        own = out.get("properties") if isinstance(out.get("properties"), dict) else {}
        out["properties"] = {**{n: {} for n in sorted(names - set(own))}, **own}
        out["additionalProperties"] = False
    return out


def _plan_json_schema(spec: Any) -> ConstraintPlan:
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema must be an object")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON schema object")
    if "name" in spec and not isinstance(spec["name"], str):
        raise ValueError("response_format.json_schema.name must be a string")
    if "strict" in spec and not isinstance(spec["strict"], bool | None):
        raise ValueError("response_format.json_schema.strict must be a boolean")
    try:
        _validator_class(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        message = f"response_format.json_schema.schema is invalid at {where}: {e.message}"
        raise ValueError(message) from None

    schema = closed_objects(schema)
    grammar, is_error, messages = _compile(schema, _STRICT)
    if not is_error and not messages:
        return ConstraintPlan("applied", grammar=grammar, schema=schema)
    if not is_error:  # compiled, but llguidance warns it approximates something
        return ConstraintPlan(
            "schema_downgraded", _downgrade_message(messages), grammar=grammar, schema=schema
        )
    # Lenient mode drops the keywords llguidance cannot express and names each one.
    grammar, is_error, lenient_messages = _compile(schema, _LENIENT)
    if not is_error:
        return ConstraintPlan(
            "schema_downgraded",
            _downgrade_message(lenient_messages or messages),
            grammar=grammar,
            schema=schema,
        )
    fallback = _type_only(schema)
    grammar, is_error, _ = _compile(fallback, _STRICT)
    if is_error:  # cannot happen for a bare type; never hand out a grammar that fails
        raise RuntimeError(f"llguidance cannot compile {fallback}")
    message = (
        f"{_downgrade_message(lenient_messages or messages)}; enforcing only {json.dumps(fallback)}"
    )
    return ConstraintPlan("schema_downgraded", message, grammar=grammar, schema=schema)


def _downgrade_message(messages: list[str]) -> str:
    return "schema feature not enforced: " + "; ".join(m.strip() for m in messages)


_JSON_OBJECT_PLAN: ConstraintPlan | None = None


def plan_response_format(response_format: dict | None) -> ConstraintPlan:
    """Compile an OpenAI response_format. Raises ValueError for a malformed one (a 400)."""
    global _JSON_OBJECT_PLAN
    if response_format is None:
        return TEXT_PLAN
    if not isinstance(response_format, dict):
        raise ValueError("response_format must be an object")
    kind = response_format.get("type")
    if not isinstance(kind, str):
        raise ValueError("response_format.type is required and must be a string")
    if kind == "text":
        return TEXT_PLAN
    if kind == "json_object":
        if _JSON_OBJECT_PLAN is None:
            grammar, _, _ = _compile(JSON_OBJECT_SCHEMA, _STRICT)
            _JSON_OBJECT_PLAN = ConstraintPlan(
                "applied", grammar=grammar, schema=JSON_OBJECT_SCHEMA
            )
        return _JSON_OBJECT_PLAN
    if kind == "json_schema":
        return _plan_json_schema(response_format.get("json_schema"))
    return ConstraintPlan(
        "ignored_unknown_type", f"response_format type {kind!r} is not supported; not enforced"
    )
