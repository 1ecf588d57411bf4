"""The harmony dialect (gpt-oss): a call is a message to `functions.NAME` whose body is
the arguments' JSON. The template renders the offered tools and replays calls and
results itself (`renders_in_template`); the parser reads the plain call markup the
harmony splitter (engine.decoding.harmony) hands on as content:
CALL_OPEN + "functions.NAME" + MESSAGE + arguments + CALL."""

from __future__ import annotations

import json

from engine.decoding.harmony import CALL, CALL_OPEN, MAX_HEADER, MESSAGE
from engine.tools.dialects.base import CallParser, Dialect, held_suffix, tool_json
from engine.tools.dialects.calls import ArgumentsDelta, ToolSpec, loads_strict

NAMESPACE = "functions."
_TEXT, _HEAD, _BODY = range(3)


def function_name(recipient: str) -> str:
    """`functions.get_weather` -> `get_weather`; other recipients as they are."""
    return recipient[len(NAMESPACE) :] if recipient.startswith(NAMESPACE) else recipient


class _HarmonyParser(CallParser):
    def __init__(self, tools: list[ToolSpec]):
        super().__init__(tools)
        self._state = _TEXT
        self._name = ""

    def _step(self, final: bool) -> bool:
        buf = self._buf
        if self._state == _TEXT:
            at = buf.find(CALL_OPEN)
            if at < 0:
                keep = 0 if final else held_suffix(buf, CALL_OPEN)
                self._text(buf[: len(buf) - keep])
                self._buf = buf[len(buf) - keep :]
                return False
            self._text(buf[:at])
            self._buf, self._state = buf[at:], _HEAD
            return True
        if self._state == _HEAD:
            at = buf.find(MESSAGE)
            if at < 0 and len(buf) <= MAX_HEADER:
                return False
            if at < 0 or at > MAX_HEADER:  # no call after all: plain text
                self._text(CALL_OPEN)
                self._buf, self._state = buf[len(CALL_OPEN) :], _TEXT
                return True
            self._name = function_name(buf[len(CALL_OPEN) : at])
            self._buf, self._state = buf[at + len(MESSAGE) :], _BODY
            return True
        at = buf.find(CALL)
        if at < 0:
            return False
        self._take_call(buf[:at])
        self._buf, self._state = buf[at + len(CALL) :], _TEXT
        return True

    def _take_call(self, body: str) -> None:
        name = self._name
        if name not in self.tools:
            self._error("unknown_function", f"no tool named {name!r}", name)
            return
        try:
            arguments = loads_strict(body) if body.strip() else {}
        except ValueError:
            self._error("malformed_call", "the arguments are not valid JSON", name)
            return
        if not isinstance(arguments, dict):
            self._error("malformed_call", "arguments must be a JSON object", name)
            return
        opened = self._open(name)
        self._out.append(ArgumentsDelta(opened.index, json.dumps(arguments)))
        self._close(opened, arguments)

    def closing_text(self) -> str | None:
        return CALL if self._state == _BODY else None

    def _at_end(self) -> None:
        buf, self._buf = self._buf, ""
        if self._state == _BODY:
            self._error("incomplete_call", "the answer ended inside a call", self._name)
        else:  # text, or a call opener that never named its function
            self._text(buf)


class _Harmony(Dialect):
    name = "harmony"
    # The chat template is given the tools and the structured history (tools.prompt's
    # for_template): what follows is only for a prompt built without it.
    renders_in_template = True

    def system_text(self, tools: list[ToolSpec]) -> str:
        listing = "\n".join(tool_json(t) for t in tools)
        return (
            "# Tools\n\nCalls to these tools must go to the commentary channel: "
            f"'functions'.\n\n{listing}"
        )

    def render_call(self, name: str, arguments: dict) -> str:
        args = json.dumps(arguments, ensure_ascii=False)
        return f"<|start|>assistant to={NAMESPACE}{name}<|channel|>commentary json{MESSAGE}{args}{CALL}"

    def render_result(self, content: str, name: str | None) -> str:
        return content

    def parser(self, tools: list[ToolSpec]) -> CallParser:
        return _HarmonyParser(tools)


HARMONY_DIALECT: Dialect = _Harmony()
