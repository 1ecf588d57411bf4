"""The XML dialects: Qwen3-Coder's <function=NAME> tags (the default), and MiniCPM's
attribute form <function name="NAME">, one parser for both."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.tools.dialects.base import (
    CallParser,
    Dialect,
    example_call,
    held_suffix,
    tool_json,
)
from engine.tools.dialects.calls import ArgumentsDelta, CallOpened, ToolSpec, coerce_text

_X_OPEN, _X_CLOSE = "<tool_call>", "</tool_call>"
_X_FUNC_END, _X_PARAM_END = "</function>", "</parameter>"
_TEXT, _FUNC, _PARAMS, _VALUE, _END, _SKIP = range(6)


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
                keep = held_suffix(buf, _X_OPEN)
                # Whitespace before a call is not content: hold it until text follows.
                safe = buf[: len(buf) - keep].rstrip()
                self._text(safe)
                self._buf = buf[len(safe) :]
            return False
        if self._state == _SKIP:
            i = buf.find(_X_CLOSE)
            if i < 0:
                keep = held_suffix(buf, _X_CLOSE)
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
            keep = held_suffix(buf, _X_OPEN)
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


class _XmlDialect(Dialect):
    """Calls as <tool_call><function ...><parameter ...>VALUE</parameter></function>
    </tool_call>, one line per tag, the function and parameter names spelled by `tags`."""

    name = "qwen3_coder_xml"
    tags = QWEN_TAGS

    def system_text(self, tools: list[ToolSpec]) -> str:
        listing = "\n".join(tool_json(t) for t in tools)
        t = self.tags
        return (
            "# Tools\n\nYou may call one or more of these functions:\n\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "To call a function, write this, its parameter blocks inside the function "
            "block, and nothing after it:\n\n"
            f"{self._example(tools)}\n\n"
            "Rules:\n"
            f"- Each call is a {t.function_tag('...')}</function> block inside "
            "<tool_call></tool_call>.\n"
            f"- {self._parameter_rule(tools)}\n"
            "- Give every required parameter. Strings are written as they are (a value "
            "may span several lines); numbers, booleans and null as JSON; objects and "
            "arrays as JSON.\n"
            "- You may explain your reasoning before the calls, not after them.\n"
            "- If no function fits, answer normally without mentioning functions."
        )

    def _example(self, tools: list[ToolSpec]) -> str:
        """The example call: the request's first tool (base.example_call), its parameter
        blocks left to the rule that describes them (no value is shown to be copied)."""
        name, _ = example_call(tools)
        return "\n".join([_X_OPEN, self.tags.function_tag(name), _X_FUNC_END, _X_CLOSE])

    def _parameter_rule(self, tools: list[ToolSpec]) -> str:
        _, parameter = example_call(tools)
        tag = self.tags.parameter_tag(parameter or "...")
        return (
            "Inside the function block, each parameter is a block of its own: a line "
            f"{tag} (the parameter's name), the value on the lines after it, then a "
            f"line {_X_PARAM_END}."
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


QWEN_XML: Dialect = _XmlDialect()
MINICPM_XML: Dialect = _MiniCpmXml()
