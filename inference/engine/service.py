"""One engine thread per loaded model instance, and the asyncio bridge to it.

The thread owns the weights, the KV cache and every forward pass. HTTP handlers submit a
frozen GenerationRequest and async-iterate the events the thread pushes back with
`loop.call_soon_threadsafe`. Nothing else touches engine state.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from .chat_template import ChatTemplate, normalize_messages
from .gguf_file import GGUFFile
from .models import architecture_module
from .sampler import Sampler
from .stop_strings import StopStringBuffer
from .tokenizer import Tokenizer
from .types import (
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    ModelConfig,
    ModelLoadError,
    ServerBusy,
    TokenEvent,
    Usage,
)

log = logging.getLogger("pantheon.engine.service")

DEFAULT_CTX_CAP = 8192


@dataclass
class _Job:
    request: GenerationRequest
    emit: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass
class EngineStats:
    """Measured rates, for estimates and /admin views. Written by the engine thread only."""

    prefill_tok_per_s: float = 0.0
    decode_tok_per_s: float = 0.0
    generations: int = 0


class ModelService:
    def __init__(self, config: ModelConfig, gf: GGUFFile, model, tokenizer: Tokenizer, template):
        self.config = config
        self.name = config.name
        self.architecture = gf.architecture
        self.weights_version = gf.weights_version
        self.path = str(gf.path)
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.created = int(time.time())
        self.on_accelerator = False
        self.stats = EngineStats()
        n_ctx_train = model.hp.n_ctx_train
        cap = config.ctx_cap if config.ctx_cap > 0 else min(n_ctx_train, DEFAULT_CTX_CAP)
        self.context_window = min(cap, n_ctx_train)
        self.max_sessions = config.max_sessions
        # No batch scheduler yet: one generation at a time is what we actually serve.
        self.max_concurrent = 1
        self.max_concurrent_configured = config.max_concurrent or config.max_sessions
        self.kv = model.make_kv_cache(1, self.context_window)
        self._busy = threading.Lock()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, config: ModelConfig) -> ModelService:
        """Open, dequantise and start serving a GGUF. Blocking; raises ModelLoadError."""
        t0 = time.perf_counter()
        gf = GGUFFile(config.path)
        arch = architecture_module(gf.architecture)
        last_logged = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.perf_counter()
            if done == total or now - last_logged[0] > 1.0:
                last_logged[0] = now
                log.info("%s: tensors %d/%d", config.name, done, total)

        try:
            tokenizer = Tokenizer.from_gguf(gf.reader)
        except (NotImplementedError, KeyError, ValueError) as exc:
            raise ModelLoadError(f"{gf.path.name}: unusable tokenizer metadata: {exc}") from exc
        template = ChatTemplate.from_gguf(gf.metadata)
        model = arch.load(gf, progress)
        svc = cls(config, gf, model, tokenizer, template)
        log.info(
            "%s: loaded %s (%s, weights %s) in %.2f s",
            config.name,
            gf.path.name,
            gf.architecture,
            svc.weights_version,
            time.perf_counter() - t0,
        )
        return svc

    # ---- request side (any thread / the event loop) ----

    def encode_chat(self, messages: list[dict]) -> list[int]:
        text = self.template.render(normalize_messages(messages), add_generation_prompt=True)
        ids = self.tokenizer.encode(text)
        bos = self.tokenizer.bos_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent | FinishEvent]:
        """Events of one generation. Raises ContextOverBudget / ServerBusy before any event.

        Closing the iterator early (client gone) aborts the generation in the engine thread.
        """
        n_prompt = len(request.prompt_ids)
        if n_prompt > self.context_window:
            raise ContextOverBudget(n_prompt, self.context_window)
        if n_prompt == 0:
            raise GenerationFailed("empty prompt")
        if not self._busy.acquire(blocking=False):
            raise ServerBusy(f"a generation is already running on model {self.name!r}")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job = _Job(request, emit=lambda ev: None)

        def emit(event: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                job.cancelled.set()

        job.emit = emit
        self._jobs.put(job)
        try:
            while True:
                event = await events.get()
                if isinstance(event, Exception):
                    raise event
                yield event
                if isinstance(event, FinishEvent):
                    return
        finally:
            job.cancelled.set()

    @property
    def in_flight(self) -> int:
        """Generations admitted and not yet finished (an unload drains these first)."""
        return 1 if self._busy.locked() else 0

    @property
    def memory_bytes(self) -> int:
        """Host memory this instance holds: float32 weights plus its KV cache."""
        return self.model.weight_bytes + self.kv.k.nbytes + self.kv.v.nbytes

    @property
    def busy(self) -> bool:
        """A generation holds the model (an aborted one holds it until its next token)."""
        return self._busy.locked()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=30)

    # ---- engine thread ----

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            final: object | None
            try:
                final = self._execute(job)
            except Exception as exc:
                log.exception("%s: generation %s failed", self.name, job.request.request_id)
                final = GenerationFailed(f"generation failed: {type(exc).__name__}")
            # Free the model before the last event, so a client's next request is not
            # refused as busy by the generation it just saw finish.
            self._busy.release()
            if final is not None:
                job.emit(final)

    def _execute(self, job: _Job) -> FinishEvent | None:
        """Run one generation, emitting its tokens; returns the FinishEvent (None if aborted)."""
        req, params = job.request, job.request.params
        prompt = np.asarray(req.prompt_ids, dtype=np.int64)
        n_prompt, chunk = len(prompt), max(1, self.config.prefill_chunk)

        t0 = time.perf_counter()
        for start in range(0, n_prompt, chunk):
            if job.cancelled.is_set():
                return None
            logits = self.model.forward(prompt[start : start + chunk], start, self.kv, 0)
        self._note_prefill(n_prompt, time.perf_counter() - t0)

        sampler = Sampler(params)
        detok = self.tokenizer.detokenizer()
        stops = StopStringBuffer(params.stop)
        end_ids = self.tokenizer.end_of_turn_ids
        pos, n_out, finish = n_prompt, 0, "length"
        t1 = time.perf_counter()
        while True:
            if job.cancelled.is_set():
                return None
            token = sampler(logits)
            if token in end_ids:
                finish = "stop"
                break
            n_out += 1
            text = stops.push(detok.push(token))
            if text:
                job.emit(TokenEvent(text=text, token_ids=(token,)))
            if stops.stopped:
                finish = "stop"
                break
            if n_out >= params.max_tokens or pos >= self.context_window:
                break
            logits = self.model.forward(np.array([token]), pos, self.kv, 0)
            pos += 1
        self._note_decode(n_out, time.perf_counter() - t1)
        if not stops.stopped:
            tail = stops.push(detok.flush()) + stops.flush()
            if tail:
                job.emit(TokenEvent(text=tail, token_ids=()))
        usage = Usage(
            prompt_tokens=n_prompt,
            completion_tokens=n_out,
            cached_tokens=0,
            kv_used=n_prompt + n_out,
            kv_cap=self.context_window,
        )
        return FinishEvent(finish_reason=finish, usage=usage)

    def _note_prefill(self, n: int, seconds: float) -> None:
        if n >= 32 and seconds > 0:
            self.stats.prefill_tok_per_s = n / seconds

    def _note_decode(self, n: int, seconds: float) -> None:
        self.stats.generations += 1
        if n >= 8 and seconds > 0:
            self.stats.decode_tok_per_s = n / seconds
