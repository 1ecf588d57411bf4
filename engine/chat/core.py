"""The chat core: a Turn in, one GenerationRequest prepared, one stream of events out.

Every wire format (OpenAI chat, Anthropic Messages, OpenAI Responses) is a thin adapter
around this: parse and validate its JSON, build a `Turn`, `prepare_turn` (CPU work, off
the event loop), iterate `run_turn` (the service's TokenEvent / FinishEvent stream:
text, reasoning, tool-call opened / arguments deltas, logprobs, finish with usage and
parsed calls; refusals raised before the first event), render. `collect` joins a stream
into the non-streamed answer the same way for every format, so a format's non-streamed
body is, by construction, its streamed events joined.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from ..decoding.response_format import plan_response_format
from ..text.chat_template import ChatTemplateError
from ..text.tokenizer import TooManyTokens
from ..tools.dialects import ArgumentsDelta, CallOpened, ToolSpec, parse_tools
from ..tools.prompt import call_plan
from ..types import (
    MAX_CHOICES,
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from .prompt import PromptBuilder
from .turn import ChatOptions, InvalidTurn, Turn, template_effort

TOOL_CHOICES = ("auto", "none", "required")


# --- preparing a turn ----------------------------------------------------------------


@dataclass(frozen=True)
class ToolPlan:
    dialect: object = None  # None: no tools offered (or tool_choice "none")
    specs: tuple[ToolSpec, ...] = ()
    plan: object = None  # the grammar compelling (or masking) a call, when one is armed
    compelled: bool = False  # tool_choice "required" or a named function
    only: str | None = None  # the function a named tool_choice asks for


@dataclass(frozen=True)
class PreparedTurn:
    """What `prepare_turn` made: the request for the engine, and what renderers need."""

    request: GenerationRequest
    turn: Turn
    tools: ToolPlan
    enable_thinking: bool
    think_open: bool  # the prompt opened a think block: the answer starts inside it
    # response_format_status to report (None: the turn sent no response_format), and why
    # a schema was downgraded (names the dropped feature) when it was.
    format_status: str | None = None
    format_message: str = ""

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def n(self) -> int:
        """Choices asked of the engine (the turn's n capped at MAX_CHOICES)."""
        return self.request.n


def tools_active(turn: Turn) -> bool:
    """Tools offered and not switched off with tool_choice "none"."""
    return bool(turn.tools) and turn.tool_choice != "none"


def thinking(turn: Turn, options: ChatOptions) -> bool:
    """Whether a think-style template opens the think block: the turn's choice, else the
    server's default (on unless PANTHEON_NO_THINK)."""
    if turn.enable_thinking is not None:
        return turn.enable_thinking
    return not options.no_think


def reasoning_budget(turn: Turn, configured: int) -> int:
    """Reasoning tokens before `</think>` is forced (<= 0: none): the turn's, else the
    model's configured budget."""
    budget = turn.reasoning_budget if turn.reasoning_budget is not None else configured
    return max(0, budget)


def named_function(choice: object) -> str | None:
    """The function a tool_choice object names; InvalidTurn for any other shape."""
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise InvalidTurn(
                'tool_choice: expected "auto", "none", "required" or a function', "tool_choice"
            )
        return None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise InvalidTurn(
            'tool_choice: expected "auto", "none", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    return name


def plan_tools(turn: Turn, dialect, options: ChatOptions) -> ToolPlan:
    """The turn's tools: the dialect the model writes, the parsed specs, and the grammar
    for this tool_choice. "required" and a named function are compelled (unless
    tool_grammar is False); "auto" is masked once a call opens only when it is True."""
    choice = turn.tool_choice or "auto"
    only = named_function(choice)
    if (choice == "required" or only is not None) and not turn.tools:
        what = '"required"' if only is None else f"the function {only!r}"
        raise InvalidTurn(
            f"tool_choice: {what} needs `tools` to call; none were given", "tool_choice"
        )
    if not tools_active(turn):
        return ToolPlan()
    try:
        specs = parse_tools(list(turn.tools))
    except ValueError as exc:
        raise InvalidTurn(f"tools: {exc}", "tools") from None
    if only is not None and only not in {t.name for t in specs}:
        raise InvalidTurn("tool_choice: expected a function named in `tools`", "tool_choice")
    setting = options.tool_grammar
    compelled = choice == "required" or only is not None
    masked_auto = choice == "auto" and setting is True
    plan = None
    if (compelled and setting is not False) or masked_auto:
        try:
            plan = call_plan(dialect, list(turn.tools), only, optional=masked_auto)
        except ValueError as exc:
            raise InvalidTurn(f"tools: {exc}", "tools") from None
    return ToolPlan(dialect, tuple(specs), plan, compelled=compelled, only=only)


def plan_format(turn: Turn) -> tuple[object, str | None, str]:
    """(the compiled constraint plan or None, the response_format_status to report or None
    when the turn sent no response_format, the downgrade message). Tools win."""
    if turn.response_format is None:
        return None, None, ""
    if tools_active(turn):
        return None, "ignored_tools_present", ""
    try:
        plan = plan_response_format(turn.response_format)
    except ValueError as exc:
        raise InvalidTurn(f"response_format: {exc}", "response_format") from None
    status = "applied" if plan.status == "text" else plan.status
    message = getattr(plan, "message", "") if status == "schema_downgraded" else ""
    return (plan if plan.grammar else None), status, message


def raw_prompt_ids(prompts: PromptBuilder, prompt: str | tuple[int, ...]) -> list[int]:
    """A raw prompt's ids: a string tokenized (BOS where the GGUF adds one), ids checked
    against the vocabulary and the window. InvalidTurn (param `prompt`) for an empty
    prompt or an id outside the vocabulary; ContextOverBudget past the window."""
    if isinstance(prompt, str):
        ids = prompts.encode_raw(prompt)
    else:
        ids = list(prompt)
        vocab = prompts.tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidTurn(
                f"prompt: token id {bad} is outside this model's {vocab}-token vocabulary",
                "prompt",
            )
    if not ids:
        raise InvalidTurn("prompt: empty (it has no tokens)", "prompt")
    window = prompts.context_window
    if len(ids) > window:
        raise ContextOverBudget(len(ids), window)
    return ids


# A prediction longer than this many characters per window token is cut before tokenizing.
PREDICTION_CHARS_PER_TOKEN = 16


def prediction_ids(prompts: PromptBuilder, prediction: str | None) -> tuple[int, ...]:
    """A Predicted Outputs text as token ids (no BOS; the prompt's tokenizer), at most a
    window's worth: drafts only, so a cut prediction costs nothing but drafts."""
    if not prediction:
        return ()
    window = prompts.context_window
    text = prediction[: window * PREDICTION_CHARS_PER_TOKEN]
    return tuple(prompts.tokenizer.encode(text)[:window])


def prepare_turn(svc, turn: Turn, options: ChatOptions | None = None) -> PreparedTurn:
    """The turn's CPU work before the engine (tools and their grammar, response_format,
    thinking, the chat template, the tokenizer): run it off the event loop, within a
    deadline. Raises InvalidTurn, or ContextOverBudget when the prompt cannot fit."""
    options = options or ChatOptions()
    prompts: PromptBuilder = svc.prompts  # the model's template and tokenizer (prompt.py)
    raw = turn.raw_prompt is not None
    truncated = 0
    tools = ToolPlan() if raw else plan_tools(turn, prompts.tool_dialect, options)
    enable_thinking = False if raw else thinking(turn, options)
    try:
        if raw:
            prompt_ids, think_open = raw_prompt_ids(prompts, turn.raw_prompt), False
        else:
            prompt_ids, think_open, truncated = chat_prompt(prompts, turn, tools, enable_thinking)
    except InvalidTurn:  # a raw prompt's own refusal (a ValueError too): as it is
        raise
    except ChatTemplateError as exc:  # the template refused this conversation
        raise InvalidTurn(f"cannot render the chat template: {exc}", "messages") from None
    except TooManyTokens as exc:  # refused before tokenizing: certain not to fit
        raise ContextOverBudget(exc.at_least, exc.limit, at_least=True) from None
    except ValueError as exc:  # a malformed tool call in the history
        raise InvalidTurn(str(exc), "messages") from None
    plan, format_status, format_message = plan_format(turn)
    if tools.plan is not None:
        plan = tools.plan
    request = GenerationRequest(
        request_id=turn.request_id or f"turn-{secrets.token_hex(12)}",
        prompt_ids=tuple(prompt_ids),
        params=turn.sampling,
        n=max(1, min(turn.n, MAX_CHOICES)),
        session_id=turn.session_id,
        session_implicit=turn.session_implicit and turn.session_id is not None,
        cache_namespace=turn.cache_namespace,
        priority=turn.priority,
        think_style=prompts.think_style and not raw,  # a raw prompt's answer is plain text
        think_open=think_open,
        harmony=prompts.harmony and not raw,
        reasoning_budget=reasoning_budget(turn, svc.config.reasoning_budget),
        constraint=plan,
        format_status=format_status,
        tool_dialect=tools.dialect,
        tools=tools.specs,
        tool_compelled=tools.compelled,
        speculation=turn.speculation or svc.config.speculation,
        prediction=prediction_ids(prompts, turn.prediction),
        truncated_messages=truncated,
    )
    return PreparedTurn(
        request=request,
        turn=turn,
        tools=tools,
        enable_thinking=enable_thinking,
        think_open=think_open,
        format_status=format_status,
        format_message=format_message,
    )


def chat_prompt(
    prompts: PromptBuilder, turn: Turn, tools: ToolPlan, enable_thinking: bool
) -> tuple[list[int], bool, int]:
    """(prompt ids, think_open, messages dropped): the conversation as it is, or with
    truncation "auto" its oldest turns dropped so that the prompt leaves room for the
    answer (max_tokens, at most a quarter of the window)."""
    messages = [dict(m) for m in turn.messages]
    specs, effort = list(tools.specs), template_effort(turn.reasoning_effort)
    if turn.truncation != "auto":
        return (*prompts.prepare_chat(messages, enable_thinking, specs, tools.dialect, effort), 0)
    window = prompts.context_window
    budget = window - min(turn.sampling.max_tokens, window // TRUNCATION_ANSWER_SHARE)
    return prompts.prepare_chat_fitting(
        messages, budget, enable_thinking, specs, tools.dialect, effort
    )


# With truncation "auto", the prompt leaves the answer max_tokens, at most 1/4 the window.
TRUNCATION_ANSWER_SHARE = 4


# --- running it ------------------------------------------------------------------------


def run_turn(svc, prepared: PreparedTurn) -> AsyncIterator[TokenEvent | FinishEvent]:
    """The one stream of events: each choice's TokenEvents then its FinishEvent (told
    apart by `index`). Refusals (ContextOverBudget, ServerBusy, ServerMemoryConstrained,
    ServerShuttingDown) are raised at the first `anext`; closing it early stops the
    generation (or takes the request out of the queue)."""
    return svc.generate(prepared.request)


def request_usage(finishes: dict[int, FinishEvent]) -> Usage:
    """The whole request's usage: the prompt counted once, completions summed over the
    choices; kv_used is the first choice's (the one a session would keep)."""
    first = finishes[min(finishes)].usage
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=sum(f.usage.completion_tokens for f in finishes.values()),
        cached_tokens=first.cached_tokens,
        kv_used=first.kv_used,
        kv_cap=max(f.usage.kv_cap for f in finishes.values()),
        session_conflict=first.session_conflict,
        reasoning_tokens=sum(f.usage.reasoning_tokens for f in finishes.values()),
        accepted_prediction_tokens=sum(
            f.usage.accepted_prediction_tokens for f in finishes.values()
        ),
        rejected_prediction_tokens=sum(
            f.usage.rejected_prediction_tokens for f in finishes.values()
        ),
        truncated_messages=first.truncated_messages,
    )


def worst_format_status(statuses) -> str | None:
    """One response_format_status for the response: a choice not enforced wins."""
    statuses = [s for s in statuses if s]
    if not statuses:
        return None
    return "not_enforced" if "not_enforced" in statuses else statuses[0]


@dataclass
class ToolCall:
    """A tool call as the stream announced it: its id, name and arguments (JSON text).
    `complete`: parsed whole; else it was cut by the token limit (finish "length") and
    `arguments` is as far as it was written."""

    id: str
    name: str
    arguments: str
    complete: bool = True


@dataclass
class ChoiceResult:
    """One choice's events joined."""

    index: int
    finish: FinishEvent
    text: str = ""
    reasoning: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return self.finish.finish_reason


@dataclass
class TurnResult:
    choices: list[ChoiceResult]  # by index
    finishes: dict[int, FinishEvent]

    @property
    def usage(self) -> Usage:
        return request_usage(self.finishes)


class CallJoiner:
    """One choice's streamed tool-call deltas joined into calls (as a client joins them)."""

    def __init__(self) -> None:
        self.opened: dict[int, list] = {}  # stream index -> [id, name, argument pieces]

    def push(self, deltas) -> None:
        for delta in deltas:
            if isinstance(delta, CallOpened):
                self.opened[delta.index] = [delta.id, delta.name, []]
            elif isinstance(delta, ArgumentsDelta) and delta.index in self.opened:
                self.opened[delta.index][2].append(delta.text)

    def calls(self, finish: FinishEvent) -> list[ToolCall]:
        """The parsed calls, and a call still open when the choice ran out of tokens
        (announced in the stream, so the non-streamed answer has it too, as OpenAI's
        does: finish "length", its arguments cut)."""
        calls = [
            ToolCall(c.id, c.name, json.dumps(c.arguments), complete=True)
            for c in finish.tool_calls
        ]
        done = {c.id for c in finish.tool_calls}
        if finish.finish_reason == "length" and self.opened:
            last_id, name, pieces = self.opened[max(self.opened)]
            if last_id not in done:
                calls.append(ToolCall(last_id, name, "".join(pieces), complete=False))
        return calls


async def collect(events: AsyncIterator[TokenEvent | FinishEvent]) -> TurnResult:
    """A turn's events joined into its non-streamed answer. The stream is closed on the
    way out (a cancelled caller stops the generation)."""
    parts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    logprobs: dict[int, list] = {}
    joiners: dict[int, CallJoiner] = {}
    finishes: dict[int, FinishEvent] = {}
    async with aclosing(events):
        async for event in events:
            if isinstance(event, FinishEvent):
                finishes[event.index] = event
                continue
            parts.setdefault(event.index, []).append(event.text)
            reasoning.setdefault(event.index, []).append(event.reasoning)
            logprobs.setdefault(event.index, []).extend(event.logprobs)
            if event.tool_calls:
                joiners.setdefault(event.index, CallJoiner()).push(event.tool_calls)
    if not finishes:
        raise GenerationFailed("the engine stream ended without a finish event")
    choices = []
    for index in sorted(finishes):
        finish = finishes[index]
        joiner = joiners.get(index) or CallJoiner()
        choices.append(
            ChoiceResult(
                index=index,
                finish=finish,
                text="".join(parts.get(index, ())),
                reasoning="".join(reasoning.get(index, ())),
                logprobs=logprobs.get(index, []),
                tool_calls=joiner.calls(finish),
            )
        )
    return TurnResult(choices, finishes)
