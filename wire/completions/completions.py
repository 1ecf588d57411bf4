"""POST /v1/completions (OpenAI's legacy completions) as a wire format over the chat core:
each prompt is a `Turn` with a raw prompt (no chat template, BOS where the GGUF adds
one), its events rendered as `text_completion` JSON or its SSE chunks.

A list of prompts runs each as its own request (choices indexed prompt by prompt: prompt
i's choice j is index i * n + j), side by side on the model's slots (streamed, their
chunks interleave). `echo` prepends the prompt; with `logprobs` the
prompt's tokens are scored too (one extra prefill pass on the engine thread, no KV
kept). `max_tokens: 0` generates nothing (with `echo` and `logprobs`: a prompt's
log-likelihood, as evaluation harnesses ask for it).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import serializers

from engine import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_CHOICES,
    MAX_TOKENS_CLAMP,
    FinishEvent,
    GenerationFailed,
    SamplingParams,
    TokenEvent,
    Turn,
    collect,
)
from pantheon_platform import shutdown
from pantheon_platform.chat_http import StartedTurn, off_loop, start_turn, turn_deadline
from pantheon_platform.errors import (
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
    shutting_down,
)
from pantheon_platform.sse import DONE, EventStreamResponse, sse_data
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
    LogitBiasField,
    StopField,
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    invalid_errors,
    parse_json_object,
)
from wire.completions.common import ModelField, text_inputs
from wire.openai_chat.request import StreamOptionsSerializer

log = logging.getLogger("pantheon.http")

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 64
MAX_LOGPROBS = 20  # OpenAI takes 0..5; alternatives per token, as top_logprobs on chat


class CompletionRequest(serializers.Serializer):
    """POST /v1/completions. Unknown fields are ignored."""

    model = ModelField()
    prompt = serializers.JSONField()
    suffix = serializers.JSONField(required=False, allow_null=True)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=0)
    temperature = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=TEMPERATURE_RANGE[0],
        max_value=TEMPERATURE_RANGE[1],
    )
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    top_k = StrictIntegerField(
        required=False, allow_null=True, min_value=-(1 << 31), max_value=(1 << 31) - 1
    )
    min_p = StrictFloatField(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CHOICES)
    best_of = StrictIntegerField(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, allow_null=True)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    logprobs = StrictIntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_LOGPROBS
    )
    echo = StrictBooleanField(required=False, allow_null=True)
    stop = StopField(required=False, allow_null=True)
    seed = StrictIntegerField(required=False, allow_null=True)
    presence_penalty = StrictFloatField(required=False, allow_null=True)
    frequency_penalty = StrictFloatField(required=False, allow_null=True)
    repetition_penalty = StrictFloatField(
        required=False, allow_null=True, max_value=REPETITION_PENALTY_MAX
    )
    logit_bias = LogitBiasField(required=False, allow_null=True)
    user = StrictCharField(required=False, allow_null=True, allow_blank=True)
    session_id = StrictCharField(required=False, allow_null=True, max_length=IDENTIFIER_MAX)

    def validate_prompt(self, value):
        return text_inputs(value, "prompts", MAX_PROMPTS)

    def validate_suffix(self, value):
        if value not in (None, ""):
            raise serializers.ValidationError(
                "not supported: this server does not fill in the middle (send no suffix)"
            )
        return value

    def validate_repetition_penalty(self, value):
        if value is not None and value <= 0:
            raise serializers.ValidationError("must be greater than 0 (1 disables it)")
        return value

    def validate(self, attrs):
        best_of, n = attrs.get("best_of"), attrs.get("n") or 1
        if best_of is not None and best_of != n:
            raise serializers.ValidationError(
                {
                    "best_of": [
                        f"not supported unless equal to n ({n}): this server returns every "
                        "choice it generates; ask for n choices instead"
                    ]
                }
            )
        return attrs

    # --- what the view reads ---

    @property
    def prompts(self) -> list[str | tuple[int, ...]]:
        return self.validated_data["prompt"]

    @property
    def n_choices(self) -> int:
        return self.validated_data.get("n") or 1

    @property
    def tokens_wanted(self) -> int:
        value = self.validated_data.get("max_tokens")
        return DEFAULT_MAX_TOKENS if value is None else min(value, MAX_TOKENS_CLAMP)

    @property
    def top_wanted(self) -> int | None:
        return self.validated_data.get("logprobs")

    @property
    def wants_echo(self) -> bool:
        return bool(self.validated_data.get("echo"))

    @property
    def is_stream(self) -> bool:
        return bool(self.validated_data.get("stream"))

    @property
    def wants_usage(self) -> bool:
        return bool((self.validated_data.get("stream_options") or {}).get("include_usage"))

    def sampling_params(self) -> SamplingParams:
        data = self.validated_data

        def given(key, default):
            value = data.get(key)
            return default if value is None else value

        return SamplingParams(
            temperature=given("temperature", DEFAULT_TEMPERATURE),
            top_k=given("top_k", DEFAULT_TOP_K),
            top_p=given("top_p", DEFAULT_TOP_P),
            max_tokens=max(1, self.tokens_wanted),  # 0 is answered without generating
            stop=data.get("stop") or (),
            seed=data.get("seed"),
            presence_penalty=max(-2.0, min(2.0, given("presence_penalty", 0.0))),
            frequency_penalty=max(-2.0, min(2.0, given("frequency_penalty", 0.0))),
            repetition_penalty=given("repetition_penalty", 1.0),
            min_p=max(0.0, min(1.0, given("min_p", 0.0))),
            logit_bias=data.get("logit_bias") or (),
            logprobs=self.top_wanted is not None,
            top_logprobs=self.top_wanted or 0,
        )


def validated(body: bytes) -> CompletionRequest:
    request = CompletionRequest(data=parse_json_object(body))
    if not request.is_valid():
        raise invalid_errors(request.errors)
    return request


# --- logprobs -----------------------------------------------------------------------


@dataclass
class Logprobs:
    """One choice's legacy logprobs object, built token by token; `text_offset` counts
    characters from the start of the choice's text (the echoed prompt included)."""

    offset: int = 0
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float | None] = field(default_factory=list)
    top_logprobs: list[dict | None] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)

    def add(self, token: str, logprob: float | None, top: dict | None) -> None:
        self.tokens.append(token)
        self.token_logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.text_offset.append(self.offset)
        self.offset += len(token)

    def add_generated(self, entries) -> None:
        for e in entries:
            self.add(e.token, e.logprob, {t: lp for t, lp, _ in e.top})

    def json(self) -> dict:
        return {
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        }

    def take(self) -> dict:
        """The entries added since the last take (a stream chunk's), offsets kept going."""
        body = self.json()
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return body


@dataclass
class PromptRun:
    """One prompt of the request: its started turn and what is echoed before its text."""

    index: int  # the prompt's place in the request
    started: StartedTurn
    echo_text: str = ""
    # The echoed prompt's tokens: (text, logprob or None, top or None), when logprobs.
    echo_entries: list = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return self.started.prepared.prompt_tokens

    def logprobs_for_choice(self) -> Logprobs:
        lp = Logprobs()
        for token, logprob, top in self.echo_entries:
            lp.add(token, logprob, top)
        return lp


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


async def echo_of(run: PromptRun, prompt, wants: int | None, echo: bool) -> None:
    """Fill in what `echo` shows of the prompt: its text, and with logprobs each prompt
    token scored after the ones before it (the first has none, as OpenAI's; a BOS this
    server added is context, not listed)."""
    if not echo:
        return
    svc = run.started.svc
    tokenizer = svc.tokenizer
    ids = list(run.started.prepared.request.prompt_ids)
    run.echo_text = prompt if isinstance(prompt, str) else tokenizer.decode(ids)
    if wants is None:
        return
    scores = await asyncio.wrap_future(svc.score(ids, wants))
    added_bos = (
        isinstance(prompt, str)
        and tokenizer.add_bos
        and ids[0] == tokenizer.bos_id
        and not prompt.startswith(token_text(tokenizer, ids[0]))
    )
    for k in range(1 if added_bos else 0, len(ids)):
        if k == 0:
            run.echo_entries.append((token_text(tokenizer, ids[0]), None, None))
            continue
        logprob, top = scores[k - 1]
        alternatives = {token_text(tokenizer, j): lp for j, lp in top}
        run.echo_entries.append((token_text(tokenizer, ids[k]), logprob, alternatives))


# --- the view --------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    id: str
    created: int
    model: str
    n: int
    logprobs: int | None
    max_tokens: int

    def body(self, choices: list, usage: dict) -> dict:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        }

    def chunk(self, index: int, text: str, logprobs: dict | None, finish: str | None) -> bytes:
        return sse_data(
            {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}
                ],
            }
        )


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@csrf_exempt
async def completions(request: HttpRequest) -> HttpResponse:
    """Parse and validate, start each prompt's turn on the chat core, render."""
    if request.method != "POST":
        return method_not_allowed(request.method or "", ["POST", "OPTIONS"]).response()
    if shutdown.draining():
        return shutting_down().response()
    stream = False
    runs: list[PromptRun] = []
    try:
        deadline = turn_deadline()
        req = await off_loop(deadline, lambda: validated(request.body))
        stream = req.is_stream
        cid = f"cmpl-{secrets.token_hex(12)}"
        prompts = req.prompts
        # A session (prefix cache) for a single prompt only: its turns would collide.
        session_id = None
        if len(prompts) == 1:
            session_id = req.validated_data.get("session_id") or request.headers.get("X-Session-Id")
            if session_id and len(session_id) > IDENTIFIER_MAX:
                raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
        sampling = req.sampling_params()
        for i, prompt in enumerate(prompts):
            turn = Turn(
                messages=(),
                raw_prompt=prompt,
                sampling=sampling,
                n=req.n_choices,
                logprobs=req.top_wanted is not None,
                request_id=f"{cid}-{i}" if len(prompts) > 1 else cid,
            )
            started = await start_turn(
                request,
                turn,
                model=req.validated_data.get("model"),
                session_id=session_id or None,
                deadline=deadline,
            )
            run = PromptRun(i, started)
            runs.append(run)
            await echo_of(run, prompt, req.top_wanted, req.wants_echo)
        completion = Completion(
            cid,
            int(time.time()),
            runs[0].started.model,
            req.n_choices,
            req.top_wanted,
            req.tokens_wanted,
        )
        if stream:
            return await stream_response(runs, completion, req.wants_usage)
        return json_response(await complete(runs, completion))
    except BaseException as exc:
        for run in runs:  # turns not yet iterated: never admitted; close them all the same
            await run.started.events.aclose()
        if not isinstance(exc, Exception):
            raise
        error = api_error_from(exc, stream=stream)
        if error.status == 500:
            log.error("completion failed", exc_info=exc)
        return error.response()


# --- the non-streamed answer ----------------------------------------------------------


async def complete(runs: list[PromptRun], completion: Completion) -> dict:
    """Every prompt's choices (side by side on the model's slots), joined."""
    svc = runs[0].started.svc
    slots = asyncio.Semaphore(max(1, svc.max_concurrent))

    async def one(run: PromptRun) -> tuple[list, int]:
        if completion.max_tokens == 0:
            await run.started.events.aclose()
            choices = [
                choice_json(run, completion, j, "", (), "length") for j in range(completion.n)
            ]
            return choices, 0
        async with slots:
            result = await collect(run.started.events)
        choices = [
            choice_json(run, completion, c.index, c.text, c.logprobs, c.finish_reason)
            for c in result.choices
        ]
        return choices, result.usage.completion_tokens

    tasks = [asyncio.ensure_future(one(run)) for run in runs]
    try:
        results = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    choices = [c for cs, _ in results for c in cs]
    prompt_tokens = sum(run.prompt_tokens for run in runs)
    completion_tokens = sum(tokens for _, tokens in results)
    return completion.body(choices, usage_json(prompt_tokens, completion_tokens))


def choice_json(run: PromptRun, completion: Completion, j, text, entries, finish) -> dict:
    logprobs = None
    if completion.logprobs is not None:
        lp = run.logprobs_for_choice()
        lp.offset = len(run.echo_text)
        lp.add_generated(entries)
        logprobs = lp.json()
    return {
        "text": run.echo_text + text,
        "index": run.index * completion.n + j,
        "logprobs": logprobs,
        "finish_reason": finish,
    }


# --- the stream -------------------------------------------------------------------------


async def stream_response(
    runs: list[PromptRun], completion: Completion, include_usage: bool
) -> HttpResponse:
    # Wait for the first prompt's first event before answering: refusals the engine knows
    # up front (context_over_budget, server_busy, memory) keep their status code.
    first = None
    if completion.max_tokens > 0:
        try:
            first = await anext(runs[0].started.events, None)
        except BaseException:
            await runs[0].started.events.aclose()
            raise
        if first is None:
            raise GenerationFailed("the engine stream ended without a finish event")
    return EventStreamResponse(sse_events(runs, first, completion, include_usage))


async def sse_events(
    runs: list[PromptRun], first, completion: Completion, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    """Each choice's echo chunk (with echo), its text chunks, its closing chunk. The
    prompts run side by side on the model's slots and their choices' chunks interleave,
    told apart by `index`."""
    prompt_tokens = sum(run.prompt_tokens for run in runs)
    completion_tokens = 0
    offsets: dict[tuple[int, int], Logprobs] = {}  # (prompt, choice) -> its logprobs so far
    for run in runs:
        for j in range(completion.n):
            lp = run.logprobs_for_choice() if completion.logprobs is not None else None
            if lp is not None:
                offsets[run.index, j] = lp
            if run.echo_text or (lp is not None and lp.tokens):
                body = None
                if lp is not None:
                    lp.offset = len(run.echo_text)
                    body = lp.take()
                yield completion.chunk(run.index * completion.n + j, run.echo_text, body, None)
    if completion.max_tokens == 0:
        for run in runs:
            await run.started.events.aclose()
            for j in range(completion.n):
                yield completion.chunk(run.index * completion.n + j, "", None, "length")
    else:
        merged: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(max(1, runs[0].started.svc.max_concurrent))

        async def pump(run: PromptRun, head) -> None:
            """One prompt's events into `merged`, then None (or the error that ended it)."""
            end = None
            try:
                async with slots:
                    if head is not None:
                        await merged.put((run, head))
                    async for event in run.started.events:
                        await merged.put((run, event))
            except Exception as exc:
                end = exc
            finally:
                merged.put_nowait((run, end))

        pumps = [
            asyncio.ensure_future(pump(run, first if run is runs[0] else None)) for run in runs
        ]
        try:
            running = len(runs)
            while running:
                run, event = await merged.get()
                if event is None:
                    running -= 1
                    continue
                if isinstance(event, Exception):
                    raise event
                index = run.index * completion.n + event.index
                if isinstance(event, FinishEvent):
                    completion_tokens += event.usage.completion_tokens
                    yield completion.chunk(index, "", None, event.finish_reason)
                elif isinstance(event, TokenEvent):
                    body = None
                    if completion.logprobs is not None and event.logprobs:
                        lp = offsets[run.index, event.index]
                        lp.add_generated(event.logprobs)
                        body = lp.take()
                    if event.text or body is not None:
                        yield completion.chunk(index, event.text, body, None)
        except Exception as exc:
            # The status line is gone: the error is the stream's last event.
            error = api_error_from(exc, stream=True)
            if error.status == 500:
                log.error(
                    "completion %s failed after the stream opened", completion.id, exc_info=exc
                )
            yield sse_data(error.body())
            return
        finally:
            # Client gone, failed or done: no pump left, every engine stream closed.
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for run in runs:
                await run.started.events.aclose()
    if include_usage:
        yield sse_data(
            {
                "id": completion.id,
                "object": "text_completion",
                "created": completion.created,
                "model": completion.model,
                "choices": [],
                "usage": usage_json(prompt_tokens, completion_tokens),
            }
        )
    yield DONE
