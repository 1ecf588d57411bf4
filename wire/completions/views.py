"""POST /v1/completions (OpenAI's legacy completions) as a wire format over the chat core:
each prompt is a `Turn` with a raw prompt (no chat template, BOS where the GGUF adds
one), its events rendered as `text_completion` JSON or its SSE chunks
(wire.completions.render).

A list of prompts runs each as its own request (choices indexed prompt by prompt: prompt
i's choice j is index i * n + j), side by side on the model's slots (streamed, their
chunks interleave). `echo` prepends the prompt; with `logprobs` the
prompt's tokens are scored too (one extra prefill pass on the engine thread, no KV
kept). `max_tokens: 0` generates nothing (with `echo` and `logprobs`: a prompt's
log-likelihood, as evaluation harnesses ask for it).
"""

from __future__ import annotations

import asyncio
import secrets
import time

from django.http import HttpRequest, HttpResponse

from engine import Turn
from pantheon_platform.chat_http import off_loop, start_turn, turn_deadline
from pantheon_platform.errors import invalid_request, json_response
from pantheon_platform.sse import EventStreamResponse
from pantheon_platform.strict_json import IDENTIFIER_MAX
from wire.completions.render import Completion, PromptRun, complete, sse_events
from wire.completions.request import validated
from wire.route import OPENAI_ERRORS, RouteCall, first_event, post_route


@post_route(OPENAI_ERRORS, "completion failed")
async def completions(request: HttpRequest, call: RouteCall) -> HttpResponse:
    """Parse and validate, start each prompt's turn on the chat core, render."""
    runs: list[PromptRun] = []
    try:
        return await _answer(request, call, runs)
    except BaseException:
        for run in runs:  # turns not yet iterated: never admitted; close them all the same
            await run.started.events.aclose()
        raise


async def _answer(request: HttpRequest, call: RouteCall, runs: list[PromptRun]) -> HttpResponse:
    """Start each prompt's turn (kept in `runs`, for the caller to close on failure),
    then answer: JSON, or the stream once its first event came."""
    deadline = turn_deadline()
    req = await off_loop(deadline, lambda: validated(request.body))
    call.stream = req.is_stream
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
            speculation=req.validated_data.get("speculation"),
            priority=req.validated_data.get("priority") or "interactive",
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
    if not call.stream:
        return json_response(await complete(runs, completion))
    # The first prompt's first event before answering: refusals the engine knows up
    # front (context_over_budget, server_busy, memory) keep their status code.
    first = await first_event(runs[0].started.events) if completion.max_tokens > 0 else None
    return EventStreamResponse(sse_events(runs, first, completion, req.wants_usage))


# --- echo -------------------------------------------------------------------------------


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
