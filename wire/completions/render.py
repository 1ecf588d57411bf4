"""POST /v1/completions' answers: each prompt's choices as `text_completion` JSON, or
their SSE chunks (the prompts side by side on the model's slots, their chunks
interleaved, told apart by `index`), with the legacy logprobs object."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from engine import FinishEvent, TokenEvent, collect
from pantheon_platform.chat_http import StartedTurn
from pantheon_platform.errors import api_error_from
from pantheon_platform.sse import DONE, sse_data

log = logging.getLogger("pantheon.http")


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


# --- the answer's shape -------------------------------------------------------------------


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
