"""The JSON dialect (served names starting "ornith"): a call is a JSON object
{"name": ..., "arguments": {...}} on its own line, bare or in a ```json fence."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.tools.dialects.base import CallParser, Dialect, example_call, tool_json
from engine.tools.dialects.calls import (
    ArgumentsDelta,
    ToolSpec,
    coerce_text,
    loads_strict,
    schema_types,
)

_TEXT, _OBJECT, _FENCE_AFTER = range(3)
_FENCE, _FENCE_END = "```json", "```"
_JSON_WS = " \t\n\r"
_CALL_KEYS = ('"name"', '"function"')
_NAME_IN_RAW = re.compile(r'"(?:name|function)"\s*:\s*"((?:[^"\\]|\\.)*)"')


def _call_key(rest: str) -> str | None:
    """'yes' / 'maybe' / None: does `rest` (after a '{') start a call object?"""
    rest = rest.lstrip(_JSON_WS)
    if not rest:
        return "maybe"
    for key in _CALL_KEYS:
        if rest.startswith(key):
            return "yes"
        if key.startswith(rest):
            return "maybe"
    return None


class _JsonParser(CallParser):
    def __init__(self, tools: list[ToolSpec]):
        super().__init__(tools)
        self._state = _TEXT
        self._fenced = False
        self._pending = ""  # whitespace and fence before an object: text if it is no call
        self._scan = (0, 0, False, False)  # pos, depth, in string, after backslash

    def _classify(self, buf: str, j: int) -> str | None:
        if buf[j] == "{":
            kind = _call_key(buf[j + 1 :])
            return kind and ("bare" if kind == "yes" else "maybe")
        rest = buf[j:]
        if rest.startswith(_FENCE):
            after = rest[len(_FENCE) :].lstrip(_JSON_WS)
            if not after:
                return "maybe"
            if after[0] != "{":
                return None
            kind = _call_key(after[1:])
            return kind and ("fence" if kind == "yes" else "maybe")
        return "maybe" if _FENCE.startswith(rest) else None

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._state == _TEXT:
            j = 0
            while True:
                starts = [k for k in (buf.find("{", j), buf.find("`", j)) if k >= 0]
                if not starts:
                    if not final:
                        safe = buf.rstrip()
                        self._text(safe)
                        self._buf = buf[len(safe) :]
                    return False
                j = min(starts)
                kind = self._classify(buf, j)
                if kind is None:
                    j += 1
                    continue
                before = buf[:j]
                text = before.rstrip()
                if kind == "maybe":
                    if not final:
                        self._text(text)
                        self._buf = buf[len(text) :]
                        return False
                    if buf[j] == "{" and buf[j + 1 :].strip(_JSON_WS):
                        self._text(text)
                        self._error("incomplete_call", "the answer ended inside a call object")
                        self._buf = ""
                        return False
                    self._text(buf[: j + 1])
                    self._buf = buf[j + 1 :]
                    return True
                self._text(text)
                start = j if kind == "bare" else buf.index("{", j)
                self._pending = buf[len(text) : start]
                self._fenced = kind == "fence"
                self._buf = buf[start:]
                self._state, self._scan = _OBJECT, (0, 0, False, False)
                return True
        if self._state == _OBJECT:
            end = self._scan_object()
            if end < 0:
                return False
            raw, self._buf = buf[:end], buf[end:]
            self._take_object(raw)
            return True
        # _FENCE_AFTER
        rest = buf.lstrip(_JSON_WS)
        if not rest:
            return False
        if rest.startswith(_FENCE_END):
            self._buf = rest[len(_FENCE_END) :]
            self._state, self._skip_ws, self._fenced = _TEXT, True, False
            return True
        kind = _call_key(rest[1:]) if rest[0] == "{" else None
        if kind == "yes":
            self._pending = buf[: len(buf) - len(rest)]
            self._buf = rest
            self._state, self._scan = _OBJECT, (0, 0, False, False)
            return True
        if kind == "maybe" or _FENCE_END.startswith(rest):
            return False
        self._state, self._skip_ws, self._fenced = _TEXT, True, False
        return True

    def _scan_object(self) -> int:
        """End (exclusive) of the object that starts the buffer, or -1 if not there yet."""
        pos, depth, in_str, esc = self._scan
        buf = self._buf
        while pos < len(buf):
            c = buf[pos]
            pos += 1
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self._scan = (0, 0, False, False)
                    return pos
        self._scan = (pos, depth, in_str, esc)
        return -1

    def _after_call(self) -> None:
        self._pending = ""
        if self._fenced:
            self._state = _FENCE_AFTER
        else:
            self._state, self._skip_ws = _TEXT, True

    def _take_object(self, raw: str) -> None:
        m = _NAME_IN_RAW.search(raw)
        guess = m.group(1) if m else None
        try:
            obj = loads_strict(raw)
        except ValueError:
            self._error("malformed_call", "the call object is not valid JSON", guess)
            self._after_call()
            return
        shape = _call_shape(obj)
        if shape is None:  # JSON that is not a call: it is content
            self._text(self._pending + raw)
            self._pending, self._fenced, self._state = "", False, _TEXT
            return
        name, args = shape
        self._after_call()
        if name not in self.tools:
            self._error("unknown_function", f"no tool named {name!r}", name)
            return
        if isinstance(args, str):
            try:
                args = loads_strict(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            self._error("malformed_call", "arguments must be a JSON object", name)
            return
        typed: dict[str, Any] = {}
        for key, value in args.items():
            schema = self._param_schema(name, key)
            if isinstance(value, str) and "string" not in schema_types(schema):
                try:
                    value = coerce_text(value, schema)
                except ValueError as e:
                    self._error("invalid_argument", f"parameter {key!r}: {e}", name, key)
                    return
            typed[key] = value
        opened = self._open(name)
        self._out.append(ArgumentsDelta(opened.index, json.dumps(typed)))
        self._close(opened, typed)

    def _at_end(self) -> None:
        buf, self._buf = self._buf, ""
        if self._state == _OBJECT:
            m = _NAME_IN_RAW.search(buf)
            function = m.group(1) if m else None
            self._error("incomplete_call", "the answer ended inside a call object", function)
        elif self._state == _TEXT:
            self._text(buf)


def _call_shape(obj: Any) -> tuple[str, Any] | None:
    """(name, arguments) when `obj` has the shape of a call, else None."""
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function")
    if isinstance(fn, dict) and "name" not in obj:  # OpenAI's own {"type", "function": {...}}
        if set(obj) - {"function", "type", "id"}:
            return None
        obj = fn
    if set(obj) - {"name", "function", "arguments", "type", "id"}:
        return None
    names = [obj[k] for k in ("name", "function") if k in obj]
    if len(names) != 1 or not isinstance(names[0], str):
        return None
    return names[0], obj.get("arguments", {})


def _example(tools: list[ToolSpec]) -> str:
    """The example call: the request's first tool (base.example_call), its arguments left
    to the sentence that describes them (no value is shown to be copied)."""
    name, _ = example_call(tools)
    return f'{{"name": {json.dumps(name)}, "arguments": {{...}}}}'


class _Json(Dialect):
    name = "json"

    def system_text(self, tools: list[ToolSpec]) -> str:
        listing = "\n".join(tool_json(t) for t in tools)
        return (
            "# Tools\n\nYou may call one or more of these functions:\n\n"
            f"{listing}\n\n"
            "To call a function, write a JSON object on its own line, one per call:\n"
            f"{_example(tools)}\n"
            "where {...} is the arguments object: each parameter's name and its value as "
            "JSON, as the function's JSON schema says; give every required one.\n"
            "If no function fits, answer normally without mentioning functions."
        )

    def render_call(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)

    def render_result(self, content: str, name: str | None) -> str:
        result: dict[str, Any] = {"name": name} if name is not None else {}
        result["content"] = content
        return json.dumps(result, ensure_ascii=False)

    def parser(self, tools: list[ToolSpec]) -> CallParser:
        return _JsonParser(tools)


JSON_DIALECT: Dialect = _Json()
