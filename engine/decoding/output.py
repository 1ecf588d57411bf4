"""One choice's output as the client sees it: token ids in, events out.

Each generated token goes: detokenizer (whole UTF-8 characters) -> stop strings (held
back while they may be starting) -> the think-block splitter (reasoning vs answer, for
think-style templates; by channel for harmony ones) -> the tool-call parser (when tools are offered: call markup is
held back until it is known to be a call or text, never shown as content) -> a
TokenEvent carrying the texts, the tool-call deltas and the token's logprobs.
Alongside: the reasoning budget (forces `</think>` after N reasoning tokens), the grammar
(armed once the think block is closed), and the loop detector. `push` says when the
choice must end early and why; `finish` flushes what was held back and settles the
response_format status (the final answer is validated against the schema).
"""

from __future__ import annotations

from collections.abc import Callable

from ..text.tokenizer import Tokenizer
from ..tools.dialects import ArgumentsDelta, CallOpened, TextDelta
from ..types import GenerationRequest, TokenEvent, TokenLogprob
from .constraints import check_output_async
from .harmony import HarmonySplitter
from .reasoning import THINK_CLOSE, ReasoningBudget, ReasoningSplitter
from .repetition import LoopDetector
from .sampler import Sample
from .schema_check import OutputVerdict
from .state import DecodeState
from .stop_strings import StopStringBuffer

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_REPETITION = "repetition_loop"
FINISH_TOOL_CALLS = "tool_calls"
APPLIED_STATUSES = ("applied", "schema_downgraded")


class ChoiceOutput:
    def __init__(
        self, request: GenerationRequest, index: int, tokenizer: Tokenizer, state: DecodeState
    ):
        params = request.params
        self.request = request
        self.index = index
        self.tokenizer = tokenizer
        self.state = state
        self.detok = tokenizer.detokenizer()
        self.stops = StopStringBuffer(params.stop)
        self.splitter: ReasoningSplitter | HarmonySplitter | None = None
        if request.think_style:
            self.splitter = ReasoningSplitter(started_inside=request.think_open)
        elif request.harmony:
            self.splitter = HarmonySplitter()
        self.budget = (
            ReasoningBudget(request.reasoning_budget, tokenizer.encode(f"\n{THINK_CLOSE}\n\n"))
            if request.think_style and request.reasoning_budget > 0
            else None
        )
        self.loop = LoopDetector()
        self.calls = (
            request.tool_dialect.parser(list(request.tools))
            if request.tool_dialect is not None
            else None
        )
        self.token_ids: list[int] = []  # sampled output, end of turn excluded
        self.content: list[str] = []
        self.reasoning_tokens = 0
        self.stopped_by_string = False
        self.want_logprobs = params.logprobs or params.top_logprobs > 0
        if not state.wants_grammar or not (self.splitter and self.splitter.in_think):
            state.arm()  # no think block to wait for: the grammar holds from the first token

    def push(self, token_id: int) -> tuple[TokenEvent | None, str | None]:
        """One sampled token: the event to send (None when nothing is ready) and the
        finish reason when the choice must end now."""
        self.token_ids.append(token_id)
        text = self.stops.push(self.detok.push(token_id))
        if self.splitter is not None:
            was_inside = self.splitter.in_think
            reasoning, content = self.splitter.push(text)
            if was_inside and not self.state.last_forced:
                self.reasoning_tokens += 1  # the forced close of the block is not reasoning
            if self.budget is not None and not self.state.last_forced:
                self.budget.on_token(was_inside)
                forced = self.budget.forced()
                if forced:
                    self.state.force(forced)
            if not self.splitter.in_think and not self.state.forced:
                # After the block (and after the rest of a forced close, whose trailing
                # newlines the grammar would refuse): the answer is held to it.
                self.state.arm()
        else:
            reasoning, content = "", text
        content, calls = self._parse_calls(content, final=False)
        self.content.append(content)
        logprobs = self._logprobs(token_id) if self.want_logprobs else ()
        event = None
        if content or reasoning or logprobs or calls:
            event = TokenEvent(
                text=content,
                token_ids=(token_id,),
                index=self.index,
                reasoning=reasoning,
                logprobs=logprobs,
                tool_calls=calls,
            )
        if self.stops.stopped:
            self.stopped_by_string = True
            return event, FINISH_STOP
        if self.loop.push(token_id):
            return event, FINISH_REPETITION
        if self.state.grammar_done:
            return event, FINISH_STOP
        return event, None

    def finish(self, ended_by_model: bool = False) -> TokenEvent | None:
        """The text held back (unless a stop string ended the choice: it stays unsaid).
        `ended_by_model`: the model chose the end of turn (not a limit, stop string or
        loop); a compelled call it left open where only closing tags are missing is
        closed here, as if the model had written them."""
        if self.stopped_by_string:
            return None
        text = self.stops.push(self.detok.flush()) + self.stops.flush()
        reasoning, content = "", text
        if self.splitter is not None:
            r1, c1 = self.splitter.push(text)
            if isinstance(self.splitter, HarmonySplitter):
                r2, c2 = self.splitter.flush(ended_by_model)
            else:
                r2, c2 = self.splitter.flush()
            reasoning, content = r1 + r2, c1 + c2
        close = ended_by_model and self.request.tool_compelled
        content, calls = self._parse_calls(content, final=True, close_open_call=close)
        self.content.append(content)
        if not (reasoning or content or calls):
            return None
        return TokenEvent(
            text=content, token_ids=(), index=self.index, reasoning=reasoning, tool_calls=calls
        )

    def finish_reason(self, reason: str) -> str:
        """`tool_calls` when a call was parsed (a loop still outranks it, and so does the
        token limit cutting a later call: its start was streamed, the answer keeps it)."""
        if reason == FINISH_LENGTH and any(e.code == "incomplete_call" for e in self.call_errors):
            return reason
        if reason != FINISH_REPETITION and self.parsed_calls:
            return FINISH_TOOL_CALLS
        return reason

    @property
    def parsed_calls(self) -> tuple:
        return tuple(self.calls.calls) if self.calls is not None else ()

    @property
    def call_errors(self) -> tuple:
        return tuple(self.calls.errors) if self.calls is not None else ()

    def _parse_calls(
        self, content: str, final: bool, close_open_call: bool = False
    ) -> tuple[str, tuple]:
        """Answer text through the tool-call parser: (plain text, call deltas)."""
        if self.calls is None:
            return content, ()
        events = self.calls.push(content) if content else []
        closing = self.calls.closing_text() if close_open_call else None
        if closing:
            events += self.calls.push(closing)
        if final:
            events += self.calls.finish()
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        deltas = tuple(e for e in events if isinstance(e, CallOpened | ArgumentsDelta))
        return text, deltas

    def settle_format(self, done: Callable[[str | None, str], None]) -> None:
        """Call `done(response_format_status, message)`: the static status, or for an
        enforced format whether the final answer really is a valid value of it. Without a
        schema to check, at once on this thread; else from the validation pool once the
        check ends (it is bounded in time; the engine thread never waits on it). A check
        that ran out of time is `not_enforced`, and the message says so."""
        status = self.request.format_status
        plan = self.request.constraint
        if status not in APPLIED_STATUSES or plan is None or plan.schema is None:
            done(status, "")
            return
        if self.state.grammar_failed:
            done("not_enforced", "")
            return

        def settled(verdict: OutputVerdict) -> None:
            if verdict.ok:
                done(status, "")
            else:
                done("not_enforced", verdict.why if verdict.timed_out else "")

        check_output_async(plan, "".join(self.content), settled)

    def _logprobs(self, token_id: int) -> tuple[TokenLogprob, ...]:
        sample: Sample | None = self.state.last
        if sample is None or sample.token_id != token_id or sample.logprob is None:
            return ()
        return (
            TokenLogprob(
                token=self._text(token_id),
                logprob=sample.logprob,
                bytes=tuple(self.tokenizer.token_bytes(token_id)),
                top=tuple(
                    (
                        self._text(t),
                        lp,
                        tuple(self.tokenizer.token_bytes(t)),
                    )
                    for t, lp in sample.top
                ),
            ),
        )

    def _text(self, token_id: int) -> str:
        """A token as text (OpenAI's `token`): its bytes decoded, a partial UTF-8
        character replaced (its exact bytes are in `bytes`)."""
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")
