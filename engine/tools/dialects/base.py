"""The two halves of a dialect: `CallParser`, which splits a streamed answer into content
and calls (each dialect's parser is one subclass), and `Dialect`, how a model family is
told about tools, writes calls and reads results."""

from __future__ import annotations

import json
import secrets
from typing import Any

from engine.tools.dialects.calls import (
    CallClosed,
    CallError,
    CallOpened,
    Event,
    ParsedCall,
    TextDelta,
    ToolSpec,
)


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


def held_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class CallParser:
    """Splits one answer's streamed text into content and tool calls (see engine.tools.dialects).

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


def tool_json(tool: ToolSpec) -> str:
    fn = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    return json.dumps({"type": "function", "function": fn}, ensure_ascii=False)


def example_call(tools: list[ToolSpec]) -> tuple[str, str | None]:
    """What the example call of a system text shows: the request's first tool's name and
    its first parameter's (required ones first; None when it takes none). Never a value:
    a small model copies an example's value (an invented one, a placeholder, an empty
    line) into its calls, so the values are described in words, not shown."""
    tool = tools[0]
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = [r for r in required if r in properties] if isinstance(required, list) else []
    names = [*required, *properties]
    return tool.name, (names[0] if names else None)


class Dialect:
    """How one family of models is told about tools, writes calls and reads results."""

    name: str = ""
    # The chat template renders the tools and the tool turns itself (harmony): the
    # prompt gives it them structured instead of this dialect's texts.
    renders_in_template: bool = False

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
