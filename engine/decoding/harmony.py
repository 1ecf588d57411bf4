"""gpt-oss's "harmony" answers: a stream of messages, each a header naming its channel
(and, for a tool call, its recipient) then a body, split into reasoning, content and
tool calls.

  <|channel|>analysis<|message|>thinking<|end|>
  <|start|>assistant<|channel|>final<|message|>The answer.<|return|>
  <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{..}<|call|>

`analysis` bodies are reasoning; `final` and `commentary` without a recipient (a preamble)
are content; a body with a recipient is a tool call, handed on as content in one plain
markup (CALL_OPEN + recipient + MESSAGE + arguments + CALL) that the harmony tool
dialect parses. Text that is not harmony is content as written, never dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
# How the splitter hands a call on to the tool-call parser (harmony_calls.py).
CALL_OPEN = CHANNEL + "commentary to="

_ENDS = (END, RETURN, CALL)
# A header where the model left out the end of the message before it.
_INTERRUPTS = (START, CHANNEL)
# What a message may start with: the prompt already wrote `<|start|>assistant`, so the
# first one starts at its channel, or at ` to=` (a recipient in the role part).
_OPENERS = (START, CHANNEL, " to=")
# A header longer than this is not one (the text is shown as content instead).
MAX_HEADER = 200

_CHANNEL_RE = re.compile(r"<\|channel\|>\s*([A-Za-z0-9_.-]*)")
_RECIPIENT_RE = re.compile(r"(?:^|\s)to=([^\s<]+)")


def is_harmony_template(source: str) -> bool:
    """The chat template writes harmony messages (gpt-oss)."""
    return CHANNEL in source


_REASONING, _CONTENT, _TOOL = range(3)


def message_kind(header: str) -> tuple[int, str]:
    """(where a message's body goes, its recipient) from the text before `<|message|>`:
    its last channel names it (gpt-oss sometimes writes a stray `commentary` first)."""
    channels = _CHANNEL_RE.findall(header)
    channel = channels[-1] if channels else ""
    recipients = [r for r in _RECIPIENT_RE.findall(header) if r != "assistant"]
    if recipients:
        return _TOOL, recipients[-1]
    return (_REASONING if channel == "analysis" else _CONTENT), ""


def _held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that could be the start of one of `tags`."""
    longest = 0
    for tag in tags:
        for n in range(min(len(text), len(tag) - 1), longest, -1):
            if tag.startswith(text[-n:]):
                longest = n
                break
    return longest


def _first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """(position, marker) of the earliest marker in `text`; (-1, "") when none."""
    found = [(at, m) for m in markers if (at := text.find(m)) >= 0]
    return min(found) if found else (-1, "")


_BETWEEN, _HEADER, _BODY, _RAW = range(4)


@dataclass
class HarmonySplitter:
    """Splits a harmony answer's streamed text into (reasoning, content), tool calls
    passed on inside content (see the module doc). Headers and end tokens are not
    emitted. Markup split across pushes is held back until it is known, so any chunking
    of one text gives the same result. Text where a header should be that is not one
    makes the rest of the answer content, as written.
    """

    in_think: bool = field(init=False, default=False)  # inside an analysis body
    _state: int = field(init=False, default=_BETWEEN, repr=False)
    _kind: int = field(init=False, default=_CONTENT, repr=False)
    _held: str = field(init=False, default="", repr=False)

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that is safe to emit now."""
        buf = self._held + text
        out: tuple[list[str], list[str]] = ([], [])
        while buf:
            if self._state == _BETWEEN:
                if buf.startswith(_OPENERS):
                    self._state = _HEADER
                elif any(o.startswith(buf) for o in _OPENERS):
                    break  # an opener still arriving
                else:
                    self._state = _RAW
            elif self._state == _HEADER:
                at = buf.find(MESSAGE)
                scanned = buf if at < 0 else buf[:at]
                if len(scanned) > MAX_HEADER or _first_marker(scanned, _ENDS)[0] >= 0:
                    self._state = _RAW  # not a header: shown as it was written
                    continue
                if at < 0:
                    break
                self._kind, recipient = message_kind(buf[:at])
                buf = buf[at + len(MESSAGE) :]
                if self._kind == _TOOL:
                    out[1].append(CALL_OPEN + recipient + MESSAGE)
                self._state, self.in_think = _BODY, self._kind == _REASONING
            elif self._state == _BODY:
                at, marker = _first_marker(buf, _ENDS + _INTERRUPTS)
                if at < 0:
                    keep = _held_suffix(buf, _ENDS + _INTERRUPTS)
                    self._emit(out, buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep :]
                    break
                self._emit(out, buf[:at])
                buf = buf[at + len(marker) :] if marker in _ENDS else buf[at:]
                self._end_message(out)
            else:  # _RAW
                out[1].append(buf)
                buf = ""
        self._held = buf
        return "".join(out[0]), "".join(out[1])

    def flush(self, ended_by_model: bool = False) -> tuple[str, str]:
        """End of generation: what was held back. `ended_by_model`: the model's end of
        turn (`<|return|>` or `<|call|>`, never in the text) closed the open message, so
        a call open here is complete; cut off by a limit, it is left open."""
        out: tuple[list[str], list[str]] = ([], [])
        held, self._held = self._held, ""
        if self._state == _BODY:
            self._emit(out, held)
            if ended_by_model:
                self._end_message(out)
        else:  # a partial header or opener is plain text after all
            out[1].append(held)
        return "".join(out[0]), "".join(out[1])

    def _emit(self, out: tuple[list[str], list[str]], text: str) -> None:
        out[0 if self._kind == _REASONING else 1].append(text)

    def _end_message(self, out: tuple[list[str], list[str]]) -> None:
        if self._kind == _TOOL:
            out[1].append(CALL)
        self._state, self._kind, self.in_think = _BETWEEN, _CONTENT, False
