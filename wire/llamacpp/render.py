"""llama-server's answers: GET /props and GET /slots (the served model's settings and
slots), and /completion's (and /infill's) JSON, or its SSE chunks, in the shapes
llama.cpp's server README documents."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import aclosing

from engine import FinishEvent, GenerationFailed, TokenEvent
from pantheon_platform.chat_http import StartedTurn
from pantheon_platform.errors import api_error_from
from pantheon_platform.runtime import build_id
from wire.llamacpp.request import DEFAULTS, GenerateRequest

log = logging.getLogger("pantheon.http")

SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]


def params_json(svc, fields: dict | None = None) -> dict:
    """A slot's `params` (props' default_generation_settings.params; a completion's
    generation_settings): `fields`, a request's, else llama-server's defaults."""
    f = fields or {**DEFAULTS, "seed": None, "stop": (), "stream": False}
    seed = f.get("seed")
    return {
        "n_predict": f["n_predict"],
        "seed": 4294967295 if seed is None or seed < 0 else seed,  # llama.cpp's "random"
        "temperature": f["temperature"],
        "top_k": f["top_k"],
        "top_p": f["top_p"],
        "min_p": f["min_p"],
        "repeat_penalty": f["repeat_penalty"],
        "presence_penalty": f["presence_penalty"],
        "frequency_penalty": f["frequency_penalty"],
        "stop": list(f["stop"]),
        "max_tokens": f["n_predict"],
        "n_keep": 0,
        "ignore_eos": bool(f.get("ignore_eos")),
        "stream": bool(f["stream"]),
        "n_probs": 0,
        "samplers": SAMPLERS,
    }


def slot_json(svc, index: int, busy: bool) -> dict:
    return {
        "id": index,
        "id_task": -1,
        "n_ctx": svc.context_window,
        "speculative": False,
        "is_processing": busy,
        "params": params_json(svc),
        "next_token": {
            "has_next_token": busy,
            "has_new_line": False,
            "n_remain": -1,
            "n_decoded": 0,
        },
    }


def slots_json(svc) -> list[dict]:
    """GET /slots: one entry per slot served now; the first `slots_busy` are processing
    (the engine does not pin requests to slot numbers)."""
    busy = svc.slots_busy
    return [slot_json(svc, i, i < busy) for i in range(svc.max_concurrent)]


def props_json(name: str, svc, full_path: bool) -> dict:
    """GET /props. `model_path` is the GGUF's file name, its full path for an operator
    (as /api/show)."""
    return {
        "default_generation_settings": {**slot_json(svc, 0, False), "prompt": ""},
        "total_slots": svc.max_concurrent,
        "model_alias": name,
        "model_path": svc.path if full_path else os.path.basename(svc.path),
        "chat_template": svc.template.source,
        "chat_template_caps": {},
        "modalities": {"vision": False, "audio": False},
        "build_info": f"pantheon-{build_id()}",
        "is_sleeping": False,
    }


# --- /completion and /infill ---------------------------------------------------------------


def stop_type(finish: FinishEvent) -> str:
    if finish.finish_reason == "length":
        return "limit"
    return "word" if finish.stop_sequence else "eos"


def timings_json(finish: FinishEvent, prompt_n: int) -> dict:
    """llama-server's timings from the engine's clock: the prompt's evaluation (to the
    first token, the queue wait left out) and the decoding after it."""
    prompt_ms = max(0.0, finish.first_token_s - finish.queue_wait_s) * 1000
    predicted_ms = finish.decode_s * 1000
    predicted_n = finish.usage.completion_tokens
    evaluated = max(0, prompt_n - finish.usage.cached_tokens)

    def per(n: int, ms: float) -> tuple[float, float]:
        return (ms / n if n else 0.0), (n * 1000 / ms if ms > 0 else 0.0)

    prompt_per_token, prompt_per_second = per(evaluated, prompt_ms)
    predicted_per_token, predicted_per_second = per(predicted_n, predicted_ms)
    return {
        "cache_n": finish.usage.cached_tokens,
        "prompt_n": evaluated,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_per_token,
        "prompt_per_second": prompt_per_second,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_per_token,
        "predicted_per_second": predicted_per_second,
    }


class Generation:
    """One /completion (or /infill) answer built from the turn's events."""

    def __init__(self, started: StartedTurn, req: GenerateRequest):
        self.started = started
        self.req = req
        self.parts: list[str] = []
        self.tokens_predicted = 0

    @property
    def prompt_n(self) -> int:
        return self.started.prepared.prompt_tokens

    def partial(self, event: TokenEvent) -> dict:
        self.parts.append(event.text)
        self.tokens_predicted += len(event.token_ids)
        return {
            "index": 0,
            "content": event.text,
            "tokens": list(event.token_ids) if self.req.stream else [],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": self.tokens_predicted,
            "tokens_evaluated": self.prompt_n,
        }

    def final(self, finish: FinishEvent, content: str) -> dict:
        svc = self.started.svc
        prompt = self.req.prompt
        text = "".join(self.parts)
        return {
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": -1,
            "stop": True,
            "model": self.started.model,
            "tokens_predicted": finish.usage.completion_tokens,
            "tokens_evaluated": self.prompt_n,
            "generation_settings": {
                "n_ctx": svc.context_window,
                "model": self.started.model,
                **params_json(svc, self.req.fields),
            },
            "prompt": prompt if isinstance(prompt, str) else svc.tokenizer.decode(prompt),
            "has_new_line": "\n" in text,
            "truncated": False,
            "stop_type": stop_type(finish),
            "stopping_word": finish.stop_sequence or "",
            "tokens_cached": finish.usage.cached_tokens,
            "timings": timings_json(finish, self.prompt_n),
        }


def sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


async def complete(events: AsyncIterator, first, generation: Generation) -> dict:
    finish = None
    async with aclosing(events):
        event = first
        while event is not None:
            if isinstance(event, FinishEvent):
                finish = event
            else:
                generation.partial(event)
            event = await anext(events, None)
    if finish is None:
        raise GenerationFailed("the engine stream ended without a finish event")
    return generation.final(finish, "".join(generation.parts))


async def stream(
    events: AsyncIterator, first: TokenEvent | FinishEvent, generation: Generation
) -> AsyncIterator[bytes]:
    """`data: {...}` chunks, each with its piece of `content`, then the final object
    (`stop: true`, content empty, every field); a failure after the stream opened is a
    `data: {"error": ...}` chunk, as llama-server ends such a stream."""
    try:
        event = first
        while event is not None:
            if isinstance(event, FinishEvent):
                yield sse(generation.final(event, ""))
                return
            chunk = generation.partial(event)
            if chunk["content"]:
                yield sse(chunk)
            event = await anext(events, None)
        raise GenerationFailed("the engine stream ended without a finish event")
    except Exception as exc:
        error = api_error_from(exc, stream=True)
        if error.status == 500:
            log.error("llama.cpp completion failed after the stream opened", exc_info=exc)
        yield sse(error.body())
    finally:
        await events.aclose()
