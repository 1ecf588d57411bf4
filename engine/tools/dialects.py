"""OpenAI tool calling in the dialects models write: the tools' system text, replaying a
call or a result into a prompt, and parsing a streamed answer into calls.

Qwen3-Coder XML is the default; MiniCPM (llama architecture, a template that adds BOS)
writes the same XML with attribute-style names; served names starting "ornith" write
JSON objects.
`CallParser.push` holds markup back until it is known to be a call or plain text, and
decides only on the text seen so far, so any chunking of one answer gives the same
calls, errors and content. Pure: no Django, no model.
"""

from __future__ import annotations

import json
import math
import re
import secrets
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


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


# --- arguments typed from the schema ----------------------------------------------------------


def _schema_types(schema: Any) -> list[str]:
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
            types += [x for x in _schema_types(sub) if x not in types]
    return types


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
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
            v = _loads(s)
        except ValueError:
            v = None
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            if t == "number":
                return v
            if isinstance(v, int) or v.is_integer():
                return int(v)
    elif t in ("object", "array"):
        try:
            v = _loads(s)
        except ValueError:
            v = None
        if isinstance(v, dict if t == "object" else list):
            return v
    raise ValueError(f"{s[:40]!r} is not a valid {t}")


def coerce_text(text: str, schema: Any) -> Any:
    """A parameter's raw text typed by its schema (a string when the schema gives no type).
    ValueError when no listed type fits."""
    types = _schema_types(schema)
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


# --- the parser ---------------------------------------------------------------------------


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class CallParser:
    """Splits one answer's streamed text into content and tool calls (see the module doc).

    `calls`, `errors` and `content` are the totals so far. A call that fails (unknown
    function, a bad argument, broken markup, cut off by the end) is left out of `calls`
    and reported in `errors`; its markup is never content. A failed call may already
    have had its CallOpened (and some ArgumentsDelta) event: it never gets a CallClosed.
    """

    def __init__(self, tools: list[ToolSpec]):
        self.tools = {t.name: t for t in tools}
        self.calls: list[ParsedCall] = []
        self.errors: list[CallError] = []
        self.content = ""
        self._buf = ""
        self._out: list[Event] = []
        self._next_index = 0
        self._skip_ws = False  # whitespace right after a call is not content
        self._finished = False

    def push(self, text: str) -> list[Event]:
        """Events for `text`, the answer's next piece."""
        if self._finished:
            raise RuntimeError("push after finish")
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[Event]:
        """End of generation: flush held text; a call still open becomes an error."""
        if self._finished:
            return []
        events = self._drain(final=True)
        self._finished = True
        return events

    def _drain(self, final: bool) -> list[Event]:
        self._out = []
        while self._step(final):
            pass
        if final:
            self._at_end()
        out, self._out = self._out, []
        return out

    def _step(self, final: bool) -> bool:  # progress made
        raise NotImplementedError

    def closing_text(self) -> str | None:
        """The markup that would close the call open at this point, when the text so far
        ends exactly where the call may be closed (all it still lacks is its closing
        tags); else None. A compelled call whose model ended the turn there gets it
        appended (the contract's "the serve appends the closing text")."""
        return None

    def _at_end(self) -> None:
        raise NotImplementedError

    # helpers for the dialects

    def _text(self, s: str) -> None:
        if self._skip_ws:
            s = s.lstrip()
        if s:
            self._skip_ws = False
            self.content += s
            self._out.append(TextDelta(s))

    def _error(self, code: str, message: str, function: str | None = None, parameter=None):
        self.errors.append(CallError(code, message, function, parameter))

    def _open(self, name: str) -> CallOpened:
        ev = CallOpened(self._next_index, _call_id(), name)
        self._next_index += 1
        self._out.append(ev)
        return ev

    def _close(self, opened: CallOpened, arguments: dict) -> None:
        call = ParsedCall(opened.id, opened.name, arguments)
        self.calls.append(call)
        self._out.append(CallClosed(opened.index, call))

    def _param_schema(self, function: str, parameter: str) -> Any:
        props = self.tools[function].parameters.get("properties")
        return props.get(parameter) if isinstance(props, dict) else None


# XML: Qwen3-Coder's <function=NAME> tags, and MiniCPM's attribute form <function name="NAME">

_X_OPEN, _X_CLOSE = "<tool_call>", "</tool_call>"
_X_FUNC_END, _X_PARAM_END = "</function>", "</parameter>"
_TEXT, _FUNC, _PARAMS, _VALUE, _END, _SKIP, _OBJECT, _FENCE_AFTER = range(8)


@dataclass(frozen=True)
class XmlTags:
    """How an XML dialect spells the tags that carry a name: `<function=NAME>` (Qwen3-Coder)
    or `<function name="NAME">` (MiniCPM). The rest of the markup is the same."""

    function: str  # up to the name
    parameter: str
    name_end: str  # after the name

    def function_tag(self, name: str) -> str:
        return f"{self.function}{name}{self.name_end}"

    def parameter_tag(self, name: str) -> str:
        return f"{self.parameter}{name}{self.name_end}"


QWEN_TAGS = XmlTags("<function=", "<parameter=", ">")
MINICPM_TAGS = XmlTags('<function name="', '<parameter name="', '">')


class _XmlParser(CallParser):
    def __init__(self, tools: list[ToolSpec], tags: XmlTags = QWEN_TAGS):
        super().__init__(tools)
        self._tags = tags
        self._state = _TEXT
        self._call: CallOpened | None = None
        self._args: dict[str, Any] = {}
        self._param: str | None = None

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._state == _TEXT:
            i = buf.find(_X_OPEN)
            if i >= 0:
                self._text(buf[:i].rstrip())
                self._buf = buf[i + len(_X_OPEN) :]
                self._state, self._call, self._args, self._param = _FUNC, None, {}, None
                return True
            if not final:
                keep = _held_suffix(buf, _X_OPEN)
                # Whitespace before a call is not content: hold it until text follows.
                safe = buf[: len(buf) - keep].rstrip()
                self._text(safe)
                self._buf = buf[len(safe) :]
            return False
        if self._state == _SKIP:
            i = buf.find(_X_CLOSE)
            if i < 0:
                keep = _held_suffix(buf, _X_CLOSE)
                self._buf = buf[len(buf) - keep :]
                return False
            self._buf = buf[i + len(_X_CLOSE) :]
            self._state, self._skip_ws = _TEXT, True
            return True
        if self._state == _VALUE:
            i = buf.find(_X_PARAM_END)
            if i < 0:
                return False
            self._buf = buf[i + len(_X_PARAM_END) :]
            self._take_value(buf[:i])
            return True
        rest = buf.lstrip()
        if not rest:
            return False
        if self._state == _FUNC:
            return self._tag(rest, {self._tags.function: self._function})
        if self._state == _PARAMS:
            return self._tag(
                rest,
                {
                    self._tags.parameter: self._parameter,
                    _X_FUNC_END: self._function_end,
                    _X_CLOSE: None,
                },
            )
        # _END
        return self._tag(rest, {_X_CLOSE: self._call_end})

    def _tag(self, rest: str, tags: dict) -> bool:
        """Dispatch on the tag `rest` starts with; False to wait for more text."""
        for tag, then in tags.items():
            if rest.startswith(tag):
                if tag in (self._tags.function, self._tags.parameter):  # a tag with a name
                    name_end = self._tags.name_end
                    end = rest.find(name_end, len(tag))
                    name = rest[len(tag) : end if end >= 0 else len(rest)]
                    if "\n" in name or "<" in name or ">" in name:
                        return self._malformed(f"bad {tag}...{name_end} tag")
                    if end < 0:
                        return False
                    self._buf = rest[end + len(name_end) :]
                    then(name.strip())
                    return True
                self._buf = rest[len(tag) :]
                if then is None:
                    self._malformed("</tool_call> before </function>", skip=False)
                    self._state, self._skip_ws = _TEXT, True
                    return True
                then()
                return True
        if any(tag.startswith(rest) for tag in tags):
            return False
        return self._malformed(f"unexpected text {rest[:20]!r} in a tool call")

    def _malformed(self, message: str, skip: bool = True) -> bool:
        function = self._call.name if self._call else None
        self._error("malformed_call", message, function)
        if skip:
            self._state = _SKIP
        return True

    def _function(self, name: str) -> None:
        if name not in self.tools:
            self._error("unknown_function", f"no tool named {name!r}", name)
            self._state = _SKIP
            return
        self._call = self._open(name)
        self._state = _PARAMS

    def _parameter(self, name: str) -> None:
        self._param, self._state = name, _VALUE

    def _take_value(self, raw: str) -> None:
        assert self._call is not None and self._param is not None
        fn, name = self._call.name, self._param
        if raw.startswith("\n"):
            raw = raw[1:]
        if raw.endswith("\n"):
            raw = raw[:-1]
        if name in self._args:
            self._error("invalid_argument", f"parameter {name!r} is given twice", fn, name)
            self._state = _SKIP
            return
        try:
            value = coerce_text(raw, self._param_schema(fn, name))
        except ValueError as e:
            self._error("invalid_argument", f"parameter {name!r}: {e}", fn, name)
            self._state = _SKIP
            return
        piece = ("{" if not self._args else ", ") + json.dumps(name) + ": " + json.dumps(value)
        self._args[name] = value
        self._out.append(ArgumentsDelta(self._call.index, piece))
        self._param, self._state = None, _PARAMS

    def _function_end(self) -> None:
        self._state = _END

    def _call_end(self) -> None:
        assert self._call is not None
        self._out.append(ArgumentsDelta(self._call.index, "}" if self._args else "{}"))
        self._close(self._call, self._args)
        self._state, self._skip_ws = _TEXT, True

    def closing_text(self) -> str | None:
        if self._buf.strip() or self._finished:
            return None
        return {_PARAMS: f"{_X_FUNC_END}\n{_X_CLOSE}", _END: _X_CLOSE}.get(self._state)

    def _at_end(self) -> None:
        buf = self._buf
        self._buf = ""
        if self._state == _TEXT:
            keep = _held_suffix(buf, _X_OPEN)
            if keep >= 2:  # "<t..." cut short: an opener, not text ("a<" stays text)
                self._text(buf[:-keep].rstrip())
                self._error("incomplete_call", "the answer ended inside <tool_call>")
            else:
                self._text(buf)
        elif self._state != _SKIP:
            function = self._call.name if self._call else None
            parameter = self._param if self._state == _VALUE else None
            where = f" in parameter {parameter!r}" if parameter else ""
            self._error(
                "incomplete_call", f"the answer ended inside a call{where}", function, parameter
            )


# JSON

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
            obj = _loads(raw)
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
                args = _loads(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            self._error("malformed_call", "arguments must be a JSON object", name)
            return
        typed: dict[str, Any] = {}
        for key, value in args.items():
            schema = self._param_schema(name, key)
            if isinstance(value, str) and "string" not in _schema_types(schema):
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


# --- dialects -----------------------------------------------------------------------------


def _tool_json(tool: ToolSpec) -> str:
    fn = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return json.dumps({"type": "function", "function": fn}, ensure_ascii=False)


class Dialect:
    """How one family of models is told about tools, writes calls and reads results."""

    name: str = ""

    def system_text(self, tools: list[ToolSpec]) -> str:
        """Instructions, the tools' JSON schemas and the call syntax, for the system turn."""
        raise NotImplementedError

    def render_call(self, name: str, arguments: dict) -> str:
        """An assistant's call exactly as the model writes it (history replay)."""
        raise NotImplementedError

    def render_result(self, content: str, name: str | None) -> str:
        """A tool's result as text for the next turn."""
        raise NotImplementedError

    def parser(self, tools: list[ToolSpec]) -> CallParser:
        raise NotImplementedError


class _XmlDialect(Dialect):
    """Calls as <tool_call><function ...><parameter ...>VALUE</parameter></function>
    </tool_call>, one line per tag, the function and parameter names spelled by `tags`."""

    name = "qwen3_coder_xml"
    tags = QWEN_TAGS

    def system_text(self, tools: list[ToolSpec]) -> str:
        listing = "\n".join(_tool_json(t) for t in tools)
        t = self.tags
        return (
            "# Tools\n\nYou may call one or more of these functions:\n\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "To call a function, write exactly this and nothing after it:\n\n"
            f"<tool_call>\n{t.function_tag('example_function_name')}\n"
            f"{t.parameter_tag('example_parameter_1')}\nvalue_1\n</parameter>\n"
            f"{t.parameter_tag('example_parameter_2')}\nA value may span\nseveral lines\n"
            "</parameter>\n</function>\n</tool_call>\n\n"
            "Rules:\n"
            f"- Each call is a {t.function_tag('...')}</function> block inside "
            "<tool_call></tool_call>.\n"
            "- Give every required parameter. Strings are written as they are; numbers, "
            "booleans and null as JSON; objects and arrays as JSON.\n"
            "- You may explain your reasoning before the calls, not after them.\n"
            "- If no function fits, answer normally without mentioning functions."
        )

    def render_call(self, name: str, arguments: dict) -> str:
        parts = [f"{_X_OPEN}\n{self.tags.function_tag(name)}\n"]
        for key, value in arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            parts.append(f"{self.tags.parameter_tag(key)}\n{text}\n{_X_PARAM_END}\n")
        parts.append(f"{_X_FUNC_END}\n{_X_CLOSE}")
        return "".join(parts)

    def render_result(self, content: str, name: str | None) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def parser(self, tools: list[ToolSpec]) -> CallParser:
        return _XmlParser(tools, self.tags)


class _MiniCpmXml(_XmlDialect):
    """MiniCPM's attribute form: <function name="NAME">, <parameter name="ARG">."""

    name = "minicpm_xml"
    tags = MINICPM_TAGS


class _Json(Dialect):
    name = "json"

    def system_text(self, tools: list[ToolSpec]) -> str:
        listing = "\n".join(_tool_json(t) for t in tools)
        return (
            "# Tools\n\nYou may call one or more of these functions:\n\n"
            f"{listing}\n\n"
            "To call a function, write a JSON object on its own line, one per call:\n"
            '{"name": "example_function_name", "arguments": {"example_parameter": "value"}}\n'
            "The arguments follow the function's JSON schema; give every required one.\n"
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


QWEN_XML: Dialect = _XmlDialect()
MINICPM_XML: Dialect = _MiniCpmXml()
JSON_DIALECT: Dialect = _Json()


def dialect_for(
    model_name: str, architecture: str = "", template_adds_bos: bool = False
) -> Dialect:
    """The dialect a served model writes (the contract's table): served names starting
    "ornith" -> JSON; llama-architecture models whose chat template adds BOS (MiniCPM) ->
    MiniCPM XML; else Qwen3-Coder XML."""
    if model_name.lower().startswith("ornith"):
        return JSON_DIALECT
    if architecture == "llama" and template_adds_bos:
        return MINICPM_XML
    return QWEN_XML
