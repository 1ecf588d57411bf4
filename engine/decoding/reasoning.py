"""Think blocks: the prompt suffix that turns thinking on or off, splitting an answer's
streamed text into `reasoning_content` and `content`, and the reasoning budget.

Only think-style templates (Qwen3, DeepSeek-R1 ...) produce reasoning; plain ChatML
answers are content throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

_OPENED = THINK_OPEN + "\n"
_CLOSED_GAP = "\n\n"  # between the tags of an empty block, and after it
_CLOSED = THINK_OPEN + _CLOSED_GAP + THINK_CLOSE + _CLOSED_GAP


def is_think_template(source: str) -> bool:
    """The chat template knows think blocks."""
    return THINK_OPEN in source


def thinking_prompt_suffix(prompt_text: str, enable_thinking: bool) -> str:
    """What to append to a rendered prompt (ending with the generation prompt) so that the
    answer starts inside an open think block (`enable_thinking`) or after a closed, empty
    one. "" when the template already did it."""
    tail = prompt_text.rstrip()
    if tail.endswith(THINK_CLOSE):
        # The template rendered a closed block (Qwen3 with enable_thinking=False): the
        # answer is content; it cannot be reopened.
        return "" if prompt_text != tail else _CLOSED_GAP
    if tail.endswith(THINK_OPEN):
        if enable_thinking:
            return ""
        gap = prompt_text[len(tail) :]
        missing = _CLOSED_GAP[len(gap) :] if _CLOSED_GAP.startswith(gap) else ""
        return missing + THINK_CLOSE + _CLOSED_GAP
    return _OPENED if enable_thinking else _CLOSED


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that could be the start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


_START, _THINK, _AFTER_CLOSE, _CONTENT = range(4)


@dataclass
class ReasoningSplitter:
    """Splits a think-style answer's streamed text into (reasoning, content).

    `started_inside`: the prompt opened the think block, so text is reasoning until
    THINK_CLOSE. Otherwise a THINK_OPEN at the very start of the answer (after optional
    whitespace) opens one, and anything else makes the whole answer content. The tags are
    not emitted, nor the whitespace right after THINK_CLOSE. A tag split across pushes is
    held back until it is known, so any chunking of one text gives the same result.
    """

    started_inside: bool = False
    in_think: bool = field(init=False)
    closed: bool = field(init=False, default=False)
    _state: int = field(init=False, repr=False)
    _held: str = field(init=False, repr=False, default="")

    def __post_init__(self) -> None:
        self.in_think = self.started_inside
        self._state = _THINK if self.started_inside else _START

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) that is safe to emit now."""
        buf = self._held + text
        reasoning, content = [], []
        while buf:
            if self._state == _START:
                rest = buf.lstrip()
                if rest.startswith(THINK_OPEN):
                    buf = rest[len(THINK_OPEN) :]
                    self._state, self.in_think = _THINK, True
                elif THINK_OPEN.startswith(rest):  # whitespace, or a tag still arriving
                    break
                else:
                    self._state = _CONTENT
            elif self._state == _THINK:
                at = buf.find(THINK_CLOSE)
                if at < 0:
                    keep = _held_suffix(buf, THINK_CLOSE)
                    reasoning.append(buf[: len(buf) - keep])
                    buf = buf[len(buf) - keep :]
                    break
                reasoning.append(buf[:at])
                buf = buf[at + len(THINK_CLOSE) :]
                self._state, self.in_think, self.closed = _AFTER_CLOSE, False, True
            elif self._state == _AFTER_CLOSE:
                buf = buf.lstrip()
                if buf:
                    self._state = _CONTENT
            else:
                content.append(buf)
                buf = ""
        self._held = buf
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """End of generation: what was held back (a partial tag is plain text after all)."""
        held, self._held = self._held, ""
        if self._state == _THINK:
            return held, ""
        return "", held


class ReasoningBudget:
    """Forces the think block closed after `budget` reasoning tokens (<= 0: unlimited).

    The engine calls `on_token(splitter.in_think)` for each generated token and, before
    sampling the next one, emits `forced()` instead when it is not empty.
    """

    def __init__(self, budget: int, close_ids: list[int]):
        self.budget = budget
        self.close_ids = list(close_ids)  # tokenizer.encode("\n</think>\n\n")
        self.used = 0
        self.spent = False  # the close sequence was handed out

    def on_token(self, in_think: bool) -> None:
        """Count one generated token that was inside the think block."""
        if in_think:
            self.used += 1

    def forced(self) -> list[int]:
        """Token ids to emit next instead of sampling: the close sequence once the budget
        is spent (exactly once), else []."""
        if self.spent or self.budget <= 0 or self.used < self.budget or not self.close_ids:
            return []
        self.spent = True
        return list(self.close_ids)
