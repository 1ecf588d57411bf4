"""Tool calls: OpenAI `tools` -> an llguidance Lark grammar compelling one well-formed call.

The call is written in an XML dialect; Qwen3-Coder's spelling (MiniCPM's differs only in
the named tags, `<function name="NAME">` and `<parameter name="ARG">`, see XmlTags):

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

A VALUE is spelled by its parameter's JSON-schema type: a string is raw text (in which "</"
never goes on with the first letter of "parameter", "function" or "tool_call", so a "</p"
can only be the closing tag, which may also follow on the value's own line; not starting
or ending with a line break, at most MAX_STRING_CHARS characters, within its
minLength/maxLength); a plain integer, number,
boolean or null is its JSON spelling; an enum of strings is one of its raw values; anything
else (objects, arrays, bounded numbers, unions) is JSON matching the schema, via llguidance's
%json, its objects closed where `additionalProperties` is unsaid. Required parameters come first, in `properties` order, then each optional one may
appear, also in `properties` order. A compelled call (`closable`) may end the turn wherever
only its closing tags are missing: after any parameter once the required ones are
written, or after </function>; the caller then appends the closing text. The caller parses the call and validates its arguments
against the tool's schema afterwards (a raw string's pattern or format is not enforced).
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance

from engine.decoding.response_format import (
    _COMPILE_DEFAULTS,
    _STRICT,
    ConstraintPlan,
    closed_objects,
)
from engine.tools.dialects import QWEN_TAGS, XmlTags

MAX_STRING_CHARS = 2000

_CLOSE_PARAMETER = "\n</parameter>\n"
# Names are spelled inside the XML tags: a ">" or a line break would end the tag early
# (without ">", MiniCPM's name="..." closes unambiguously at the first '">').
_BAD_NAME = re.compile(r"[<>\s]")
# An integer and a number, as JSON spells them (no leading zeros: json.loads reads them).
_INTEGER = r"-?(0|[1-9][0-9]*)"
_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"


def _lit(text: str) -> str:
    """A Lark string literal (Lark's escapes are JSON's)."""
    return json.dumps(text)


def _regex(pattern: str) -> str:
    """A Lark /regex/ literal."""
    return "/" + pattern.replace("/", "\\/") + "/"


def _without(words: list[str]) -> str:
    """A regex for text containing none of `words`, each with one "<", at its start."""
    assert all(w.startswith("<") and w.count("<") == 1 for w in words)
    trie: dict = {}
    for w in words:
        node = trie
        for c in w[1:]:
            node = node.setdefault(c, {})

    def run(node: dict) -> str:
        """A run of [^<] after a "<" that does not finish a word from this trie node."""
        chars = "".join(re.escape(c) for c in node)
        alts = [f"[^<{chars}][^<]*"]
        alts += [f"{re.escape(c)}({run(child)})?" for c, child in node.items() if child]
        return "|".join(alts)

    # Text is runs of [^<], each after a "<" but the first: no run may spell a word's rest.
    return f"[^<]*(<({run(trie)})?)*"


# Raw text never starts a closing tag: "</" may not go on with the first letter of
# "</parameter>", "</function>" or "</tool_call>", so once "</p" is written only the
# parameter's closing tag may follow (a model that wrote "</parameter:" or "</function"
# inside a value never found its way out; a first-match parser would cut the value at a
# written tag). "</b>", "</div>" and the like stay writable.
_VALUE_TEXT = _regex(_without(["</p", "</f", "</t"]))
# The closing tag after raw text, its line break optional: a value ended by "</parameter>"
# on the same line reads the same (the parser drops one line break at either end).
_CLOSE_RAW = _regex(r"\n?</parameter>\n")


def _string_token(schema: dict) -> tuple[str, str]:
    """(raw text plus the closing tag as one lexeme, warning): the lexer never has to guess
    whether a newline belongs to the text or starts "</parameter>"."""
    low, high = schema.get("minLength", 0), schema.get("maxLength", MAX_STRING_CHARS)
    low = low if isinstance(low, int) and low > 0 else 0
    high = min(high, MAX_STRING_CHARS) if isinstance(high, int) and high >= 0 else 0
    if low > high:
        raise ValueError(f"string schema {json.dumps(schema)} allows no value")
    # No line break at either end (the syntax's own surround the value): 1 char, or
    # first + middle + last.
    shapes = [""] if low == 0 else []
    if low <= 1 <= high:
        shapes.append(r"[^\n]")
    if high >= 2:
        shapes.append(rf"[^\n](.|\n){{{max(low - 2, 0)},{high - 2}}}[^\n]")
    shape = _regex("|".join(f"({s})" for s in shapes))
    # Derived from the closing tag, never "~/...</parameter>.../": llguidance cannot always
    # tell that a lexeme built with "~" is finished, and then refuses what follows it.
    token = f"({_VALUE_TEXT} & {shape}) {_CLOSE_RAW}"
    loose = [k for k in ("pattern", "format", "contentEncoding") if k in schema]
    return token, f"{', '.join(loose)} of raw strings not enforced" if loose else ""


def _json_rule(schema: dict) -> tuple[str, str]:
    """(Lark %json expansion, warning or "") for a schema llguidance compiles, else a
    weaker schema it does. Objects are closed as for response_format (closed_objects)."""
    schema = closed_objects(schema)
    guidance = {**_COMPILE_DEFAULTS, **_STRICT}
    attempts = [
        {**schema, "x-guidance": guidance},
        {**schema, "x-guidance": {**_COMPILE_DEFAULTS, "lenient": True}},
    ]
    kind = schema.get("type")
    attempts.append({"type": kind} if isinstance(kind, str | list) and kind else {})
    attempts[-1]["x-guidance"] = guidance
    for i, attempt in enumerate(attempts):
        rule = "%json " + json.dumps(attempt)
        grammar = _wrap(f"start: {rule}\n")
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            continue
        warning = "; ".join(m.strip() for m in messages)
        if i == 2:
            warning = f"{warning}; enforcing only {json.dumps(attempts[2])}"
        return rule, warning
    raise ValueError(f"cannot compile a grammar for parameter schema {json.dumps(schema)}")


_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
    }
)
_STRING_KEYWORDS = frozenset(
    {"type", "minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType"}
)
_SCALARS = {
    "integer": _regex(_INTEGER),
    "number": _regex(_NUMBER),
    "boolean": '("true" | "false")',
    "null": '"null"',
}


def _value(schema: Any) -> tuple[str, bool, str]:
    """(Lark expansion of VALUE + closing tag, is a token, warning) for a parameter schema."""
    if not isinstance(schema, dict):
        schema = {}
    close = _lit(_CLOSE_PARAMETER)
    enum = schema.get("enum")
    kind = schema.get("type")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        alts = " | ".join(_lit(v) for v in dict.fromkeys(enum))
        return f"({alts}) {close}", True, ""
    # Bounds, multipleOf and the like are left to %json, which enforces them.
    plain = set(schema) <= _ANNOTATIONS | {"type"}
    if kind == "string" and enum is None and set(schema) <= _ANNOTATIONS | _STRING_KEYWORDS:
        token, warning = _string_token(schema)
        return token, True, warning
    if plain and kind in _SCALARS:
        return f"{_SCALARS[kind]} {close}", True, ""
    rule, warning = _json_rule(schema)
    return f"{rule} {close}", False, warning


def _wrap(lark: str) -> str:
    return json.dumps({"grammars": [{"lark_grammar": lark}]})


def _function(tool: Any, index: int) -> tuple[str, dict]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ValueError(f"{where} must be a function tool")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"{where}.function must be an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name or _BAD_NAME.search(name):
        raise ValueError(f"{where}.function.name must be a non-empty name without <, > or spaces")
    params = fn.get("parameters", {"type": "object"})
    if params is None:
        params = {"type": "object"}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ValueError(f"{where}.function.parameters must be an object schema")
    return name, params


def _parameters(name: str, params: dict) -> list[tuple[str, Any, bool]]:
    """[(argument, schema, required)] in the order the grammar emits them."""
    props = params.get("properties", {})
    required = params.get("required", [])
    if not isinstance(props, dict) or not all(isinstance(k, str) for k in props):
        raise ValueError(f"tool {name!r}: parameters.properties must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"tool {name!r}: parameters.required must be a list of names")
    for arg in [*props, *required]:
        if not arg or _BAD_NAME.search(arg):
            raise ValueError(f"tool {name!r}: parameter name {arg!r} cannot be spelled in a tag")
    for arg, schema in props.items():
        if not isinstance(schema, dict | bool):
            raise ValueError(f"tool {name!r}: the schema of parameter {arg!r} must be an object")
    # A parameter's schema compiles on its own: give it the definitions its $refs point into.
    defs = {k: params[k] for k in ("$defs", "definitions") if isinstance(params.get(k), dict)}
    if defs:
        props = {
            a: {**defs, **v} if isinstance(v, dict) and '"$ref"' in json.dumps(v) else v
            for a, v in props.items()
        }
    must = set(required)
    order = [(a, s, True) for a, s in props.items() if a in must]
    order += [(a, {}, True) for a in dict.fromkeys(required) if a not in props]
    order += [(a, s, False) for a, s in props.items() if a not in must]
    return order


def tool_call_plan(
    tools: list[dict],
    only: str | None = None,
    optional: bool = False,
    tags: XmlTags = QWEN_TAGS,
    closable: bool = False,
) -> ConstraintPlan:
    """A grammar for exactly one call to one of `tools` (or to the tool named `only`), then
    the end of turn. Raises ValueError for a malformed tool or an unknown `only`.

    `optional` (tool_choice "auto" with the grammar on): free text, which may end the turn,
    or free text then one call held to the grammar from its opening tag on. The text and
    the opener are one lexeme (text that never spells the opener, then the opener), so the
    lexer never has to take back a "<" it already gave to the text.

    `tags`: the dialect's spelling of the named tags. `closable` ("required" or a named
    function): the end of turn is also allowed where only the closing tags are missing."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list")
    functions: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        name, params = _function(tool, i)
        if name in functions:
            raise ValueError(f"tools[{i}]: the function name {name!r} is offered twice")
        functions[name] = params
    if only is not None:
        if only not in functions:
            raise ValueError(f"tool_choice names {only!r}, which is not among the tools")
        functions = {only: functions[only]}

    rules: list[str] = []
    calls: list[str] = []
    warnings: list[str] = []
    for f, (name, params) in enumerate(functions.items()):
        parts = [_lit(tags.function_tag(name) + "\n")]
        for p, (arg, schema, required) in enumerate(_parameters(name, params)):
            value, is_token, warning = _value(schema)
            if warning:
                warnings.append(f"{name}.{arg}: {warning}")
            rule = f"f{f}_p{p}"
            opening = _lit(tags.parameter_tag(arg) + "\n")
            if is_token:
                rules.append(f"{rule.upper()}_V: {value}")
                rules.append(f"{rule}: {opening} {rule.upper()}_V")
            else:
                rules.append(f"{rule}: {opening} {value}")
            parts.append(rule if required else f"{rule}?")
        rules.append(f"call_{f}: " + " ".join(parts))
        calls.append(f"call_{f}")
    function_end, call_end = _lit("</function>\n"), _lit("</tool_call>")
    if closable and not optional:  # the turn may end where only closing tags are missing
        tail = f"({function_end} {call_end}?)?"
    else:
        tail = f"{function_end} {call_end}"
    body = f"({' | '.join(calls)}) {tail}"
    if optional:
        text = _without(["<tool_call>"])
        head = [
            f"start: TEXT | OPENING {body}",
            f"TEXT: {_regex(text)}",
            f"OPENING: {_regex(f'(?:{text})<tool_call>' + chr(92) + 'n')}",
        ]
    else:
        head = [f"start: {_lit('<tool_call>' + chr(10))} {body}"]
    lark = "\n".join(head + rules)
    grammar = _wrap(lark + "\n")
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError("cannot build a tool-call grammar: " + "; ".join(messages))
    warnings += [m.strip() for m in messages]
    if warnings:
        message = "schema feature not enforced: " + "; ".join(warnings)
        return ConstraintPlan("schema_downgraded", message, grammar=grammar)
    return ConstraintPlan("applied", grammar=grammar)
