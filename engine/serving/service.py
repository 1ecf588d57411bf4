"""One model instance: the facade the apps use (loading, what is served, prompts, jobs,
generation, sessions), over the engine thread that does the work (loop.py).

HTTP handlers submit a frozen GenerationRequest and async-iterate its events: admission
(admission.py) refuses it or queues it for the engine loop, which pushes each event to
the handler's event loop with `loop.call_soon_threadsafe`. Prompts are built by the chat
package (engine/chat/prompt.py); sessions travel as blobs through session_transfer.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Generator, Sequence
from concurrent.futures import Future

from ..chat.prompt import PromptBuilder
from ..decoding.constraints import GrammarTokenizer
from ..loading.gguf_file import GGUFFile
from ..loading.model_load import load_model
from ..loading.progress import ProgressCallback
from ..text.tokenizer import Tokenizer
from ..types import (
    MAX_CHOICES,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    ModelConfig,
    TokenEvent,
)
from .admission import Admission
from .conversation import Conversation
from .draft_model import DraftModel, load_draft
from .embedding import default_pooling, embed_job, score_job
from .loop import EngineLoop
from .memory import MemoryLadder, device_memory, host_memory
from .records import EngineRequest
from .session_blob import KVLayout, SessionSnapshot
from .session_key import SessionKey
from .session_transfer import ExportedSession, SessionTransfer
from .sessions import SessionInfo

log = logging.getLogger("pantheon.engine.service")

DEFAULT_CTX_CAP = 8192


class ModelService:
    """One loaded model instance, as the apps see it: what it serves and its limits now,
    its prompts, generation, jobs and sessions. The work is done by its parts (the engine
    loop, admission, the prompt builder, session transfer), which it builds and wires."""

    def __init__(
        self,
        config: ModelConfig,
        gf: GGUFFile,
        model,
        tokenizer: Tokenizer,
        template,
        draft: DraftModel | None = None,
    ):
        self.config = config
        self.name = config.name
        self.gguf = gf
        self.architecture = gf.architecture
        self.quantization = gf.quantization
        self.weights_version = gf.weights_version
        self.path = str(gf.path)
        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.created = int(time.time())
        self.load_seconds = 0.0  # set by load()
        self.weight_cache_used = False
        self.on_accelerator = model.backend.on_accelerator
        # What the weights compute with: "cpu" (compiled kernels, with the SIMD level they
        # chose) or "numpy"; and the tensor types that fell back to float32 on the way.
        self.kernel = model.backend.name
        self.kernel_isa = getattr(model.backend, "isa", None)
        self.kernel_activations = getattr(model.backend, "activations", None)
        self.kernel_fallback = dict(getattr(model, "fallback_types", {}))
        n_ctx_train = model.hp.n_ctx_train
        cap = config.ctx_cap if config.ctx_cap > 0 else min(n_ctx_train, DEFAULT_CTX_CAP)
        self.context_window_configured = min(cap, n_ctx_train)
        self.max_sessions = config.max_sessions
        # One KV slot per concurrently decoded sequence (the contract: 0 -> max_sessions).
        self.max_concurrent_configured = max(1, config.max_concurrent or config.max_sessions)
        # Stored as the kv_dtype load option asks (a sibling may differ from the load's).
        self.kv = model.make_kv_cache(
            self.max_concurrent_configured, self.context_window_configured, config.kv_dtype
        )
        # The dies the layers live on (kernels.devices.dies), and what serving holds there.
        self.placed_on = list(getattr(model, "dies", ()))
        self.dies = [d.ordinal for d in self.placed_on]
        if self.placed_on:
            model.hold(self.name, self.kv)
        self.ladder = MemoryLadder(
            self.max_concurrent_configured,
            self.context_window_configured,
            probe=self._die_memory if self.on_accelerator else host_memory,
        )
        self.prompts = PromptBuilder(
            self.name, self.architecture, tokenizer, template, self.context_window_configured
        )
        self.engine_loop = EngineLoop(
            self.name,
            config,
            model,
            self.kv,
            tokenizer,
            self.ladder,
            slots=self.max_concurrent_configured,
            window=self.context_window_configured,
            draft=draft,
        )
        self.draft = draft  # the draft model for speculation (config.draft_model), or None
        # The engine loop's parts, as the apps, benches and tests read them.
        self.stats = self.engine_loop.stats
        self.slot_contents = self.engine_loop.slot_contents
        self.scheduler = self.engine_loop.scheduler
        self.runner = self.engine_loop.runner
        self.sessions = self.engine_loop.sessions
        self._thread = self.engine_loop.thread
        self.admission = Admission(
            self.name, self.engine_loop, self.ladder, self.kv, self.context_window_configured
        )
        self.transfer = SessionTransfer(
            self.sessions,
            self.kv,
            self.architecture,
            self.weights_version,
            tokenizer.vocab_size,
            self.context_window_configured,
        )
        self.engine_loop.start()

    @classmethod
    def load(cls, config: ModelConfig, on_progress: ProgressCallback | None = None) -> ModelService:
        """Open, dequantise and start serving a GGUF (loading/model_load.py). Blocking;
        raises ModelLoadError. `on_progress` is called on the loading thread after each
        step (loading/progress.py)."""
        t0 = time.perf_counter()
        loaded = load_model(config, on_progress)
        gf = loaded.gguf
        draft = load_draft(config, gf)
        svc = cls(config, gf, loaded.model, loaded.tokenizer, loaded.template, draft)
        svc.load_seconds = round(time.perf_counter() - t0, 3)
        svc.weight_cache_used = loaded.weight_cache_used
        log.info(
            "%s: loaded %s (%s, weights %s) in %.2f s%s",
            config.name,
            gf.path.name,
            gf.architecture,
            svc.weights_version,
            svc.load_seconds,
            " from the weight cache" if svc.weight_cache_used else "",
        )
        return svc

    def sibling(self, config: ModelConfig) -> ModelService:
        """Another instance over the same (read-only) weights with its own KV cache,
        scheduler and thread: a different configuration without loading the file again
        (its draft model, if it names one, is loaded)."""
        draft = load_draft(config, self.gguf)
        svc = type(self)(config, self.gguf, self.model, self.tokenizer, self.template, draft)
        svc.weight_cache_used = self.weight_cache_used
        return svc

    # ---- what is served now ----

    @property
    def max_concurrent(self) -> int:
        """Sequences decoded at once right now: the configured slots, unless the memory
        ladder lowered them (the contract's served value)."""
        return self.ladder.slots

    @property
    def context_window(self) -> int:
        """The effective per-session window: configured, unless the ladder clamped it."""
        return self.ladder.window

    @property
    def memory_pressure(self) -> str:
        return self.ladder.level_name

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished, queued ones included (an unload drains these)."""
        return self.scheduler.in_flight

    @property
    def queued(self) -> int:
        return self.scheduler.queued

    @property
    def slots_busy(self) -> int:
        """Sequences holding a KV slot now."""
        return self.scheduler.running

    @property
    def kv_tokens_used(self) -> int:
        """KV positions the running sequences fill (of max_concurrent x context_window)."""
        with self.engine_loop.lock:
            return self.scheduler.kv_tokens

    @property
    def graphs(self) -> dict | None:
        """The contract's operator `graphs` object for a model whose decode steps go through
        CUDA-graph slots (None without slots, or until one was exercised)."""
        report = getattr(self.model, "graphs_report", None)
        return report(operator=True) if report else None

    @property
    def attention(self) -> dict | None:
        """The contract's operator `attention` object for a model on dies (None elsewhere,
        and until a forward pass has reached its layers)."""
        residency = getattr(self.model, "attention_residency", None)
        return residency() if residency else None

    @property
    def busy(self) -> bool:
        """Some request is queued or generating (an aborted one until the engine notices)."""
        return self.scheduler.in_flight > 0

    @property
    def memory_bytes(self) -> int:
        """Host memory this instance may hold: float32 weights plus its whole KV cache
        (and its draft model's)."""
        draft = self.engine_loop.speculator.draft
        extra = draft.draft.model.weight_bytes + draft.kv.nbytes if draft is not None else 0
        return self.model.weight_bytes + self.kv.nbytes + extra

    @property
    def kv_dtype(self) -> str:
        """What the KV cache stores keys and values as: f32, f16 or q8_0 (`kv_dtype`)."""
        return self.kv.kv_dtype

    @property
    def kv_bytes_per_token(self) -> int:
        """One position of the KV cache in its type: K and V of every layer, in bytes."""
        return self.kv.bytes_per_token()

    # ---- prompts (any thread; engine/chat/prompt.py) ----

    @property
    def think_style(self) -> bool:
        """The chat template knows `<think>` blocks (reasoning is split from the answer)."""
        return self.prompts.think_style

    @property
    def harmony(self) -> bool:
        """The model writes harmony (gpt-oss): it always reasons, on its analysis channel."""
        return self.prompts.harmony

    @property
    def tool_dialect(self):
        """The tool-call dialect this model writes (tool_dialects.dialect_for)."""
        return self.prompts.tool_dialect

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.prompts.encode_chat(messages)

    def prepare_chat(
        self,
        messages: list[dict],
        enable_thinking: bool = True,
        tools: list | None = None,
        dialect=None,
    ) -> tuple[list[int], bool]:
        """The prompt ids, and whether the answer starts inside a think block."""
        return self.prompts.prepare_chat(messages, enable_thinking, tools, dialect)

    def encode_raw(self, text: str) -> list[int]:
        """A raw prompt's ids (no chat template). TooManyTokens when certain not to fit."""
        return self.prompts.encode_raw(text)

    def grammar_tokenizer(self) -> GrammarTokenizer:
        """llguidance's view of this vocabulary (built on first use, then cached)."""
        return GrammarTokenizer.for_tokenizer(self.tokenizer)

    # ---- jobs beside generation (any thread) ----

    @property
    def pooling(self) -> str:
        """How embeddings pool: the `pooling` load option, else the architecture's."""
        return self.config.pooling or default_pooling(self.architecture)

    @property
    def embedding_width(self) -> int:
        return self.model.hp.d_model

    def submit(self, job: Generator) -> Future:
        """Run `job` on the engine thread: one `next()` per engine iteration (between
        generation steps, so streams keep flowing), its return value the future's result.
        Cancelling the future drops the job at its next step."""
        self.admission.check_open()
        return self.engine_loop.submit(job)

    def clear_prefix_cache(self) -> Future:
        """Forget the KV that free slots keep for prompts beginning the same way (their
        pages go back to the OS); the next prompts are computed whole. Resolves to the
        number of slots released."""

        def job():
            return self.engine_loop.keeper.clear()
            yield  # a generator: submit() runs it on the engine thread

        return self.submit(job())

    def embed(self, token_lists: Sequence[Sequence[int]]) -> Future:
        """Embeddings of token lists, (N, D) float32 L2-normalised rows pooled as
        `self.pooling`: each list prefilled alone in `prefill_chunk` chunks on a scratch
        cache (no KV kept), so a row is the same bits alone or in a batch. Refusals
        (ContextOverBudget, ServerMemoryConstrained, ...) are raised here."""
        self.admission.check(max((len(ids) for ids in token_lists), default=0))
        if any(not ids for ids in token_lists):
            raise GenerationFailed("empty input")
        return self.submit(
            embed_job(self.model, token_lists, self.pooling, self.config.prefill_chunk)
        )

    def score(self, ids: Sequence[int], top_n: int = 0) -> Future:
        """Each token's log-probability after the ones before it (raw logits), with the
        `top_n` most likely alternatives: [(logprob, ((id, logprob), ...))] for ids[1:]."""
        self.admission.check(len(ids))
        return self.submit(score_job(self.model, ids, top_n, self.config.prefill_chunk))

    # ---- generation (the event loop) ----

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent | FinishEvent]:
        """Events of one request: each choice's TokenEvents and its FinishEvent (told apart
        by `index`, interleaved as produced); the iterator ends after the last choice's
        FinishEvent. All `n` choices run: those beyond the served slots sample their first
        token with the others, then wait for one of the request's slots to free
        (scheduler.py), so their events may come well after the first choices ended.

        Refusals are raised before any event: ContextOverBudget, ServerMemoryConstrained,
        ServerShuttingDown, and ServerBusy (queue full at once, or queue wait timed out).
        Closing the iterator early (client gone) takes the request out of the queue, or
        aborts its generation at the engine's next step.
        """
        self.admission.check(len(request.prompt_ids))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        req = EngineRequest(request, emit=lambda ev: None)

        def emit(event: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                req.closed = True

        def put_all(batch: list) -> None:
            for event in batch:
                events.put_nowait(event)

        req.emit = emit
        req.handoff = (loop, put_all)
        n = max(1, min(request.n, MAX_CHOICES))
        session_id = request.session_id if self.sessions.enabled else None
        if session_id is not None:
            self.admission.begin_session_turn(
                session_id, len(request.prompt_ids), implicit=request.session_implicit
            )
        self.admission.enqueue(req, n, session_id)
        finished = 0
        try:
            while True:
                event = await events.get()
                if isinstance(event, Exception):
                    raise event
                yield event
                if isinstance(event, FinishEvent):
                    finished += 1
                    if finished >= event.choices:
                        return
        finally:
            self.engine_loop.withdraw(req)
            if session_id is not None:
                self.sessions.end_turn(session_id)

    def simulate_memory_pressure(self, level: int | None) -> None:
        """Test hook (an operator route): pin the memory ladder at `level` (0 normal ..
        3 critical), or None to follow real free memory again. The served numbers change
        at once; running generations see the new limits at the engine's next step."""
        self.ladder.simulate(level)
        self.engine_loop.ladder_moved()

    def estimate_prefill_s(self, tokens: int) -> tuple[float, float, bool]:
        """(seconds to prefill `tokens` cold, the rate used, whether it was measured)."""
        return self.admission.estimate_prefill_s(tokens)

    def begin_drain(self) -> None:
        """Admit nothing new (ServerShuttingDown); queued and running requests finish."""
        self.admission.begin_drain()

    def set_queue_limits(self, depth: int, timeout_s: float) -> None:
        """A new queue depth and timeout (the runtime config), from the next request on:
        requests already queued keep their place."""
        self.admission.set_queue_limits(depth, timeout_s)

    # ---- sessions (any thread; session_transfer.py) ----

    @property
    def kv_layout(self) -> KVLayout:
        return self.transfer.kv_layout

    def snapshot(self, key: SessionKey, conv: Conversation) -> SessionSnapshot:
        """One parked conversation as a blob's contents (export and the disk writer)."""
        return self.transfer.snapshot(key, conv)

    def export_session(self, session_id: str) -> ExportedSession:
        """The id's most recently used conversation as a portable blob. Raises
        SessionNotFound, SessionBusy (a turn in flight)."""
        return self.transfer.export(session_id)

    def restore_session(self, session_id: str, blob: bytes, tokens: list[int] | None) -> int:
        """Install an exported conversation under `session_id`; returns its token count.
        Raises BadSessionBlob, WeightsVersionMismatch, SessionCapacity, SessionBusy."""
        return self.transfer.restore(session_id, blob, tokens)

    def release_session(self, session_id: str) -> bool:
        """Free every conversation of the id now (idempotent); False if it held none."""
        return self.sessions.release(session_id)

    def session_info(self) -> list[SessionInfo]:
        return self.sessions.info()

    # ---- lifetime ----

    def close(self) -> None:
        """Stop the engine thread; requests still in flight fail with GenerationFailed."""
        self.engine_loop.close()
        if self.placed_on:
            self.model.release(self.kv)  # once: a second close() finds nothing held

    def _die_memory(self) -> tuple[int, int]:
        """(free, total) of the fullest die this model is on, as the ladder reads it."""
        return min((die.run(device_memory) for die in self.placed_on), default=(0, 0))
