"""One engine thread per loaded model instance, and the asyncio bridge to it.

The thread owns the weights, the KV cache and every forward pass. It loops: schedule a
step (scheduler.py), run it (runner.py), record the sampled ids, and push each request's
events to its event loop with `loop.call_soon_threadsafe`. HTTP handlers submit a frozen
GenerationRequest and async-iterate those events. The scheduler's bookkeeping is shared
with the handlers (admission, cancellation) under one lock, held for microseconds;
arrays and forward passes are the thread's alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernels import die_backend, get_backend
from kernels.devices import dies, threads

from ..decoding.constraints import Constraint, GrammarTokenizer
from ..decoding.output import ChoiceOutput
from ..decoding.reasoning import is_think_template, thinking_prompt_suffix
from ..decoding.sampler import Sampler
from ..decoding.state import DecodeState
from ..loading.gguf_file import GGUFFile, file_weights_version
from ..loading.progress import CACHE_WRITE, PARSE, LoadReporter, ProgressCallback, ProgressLog
from ..loading.weight_cache import WeightCache
from ..models import WEIGHT_LAYOUT_VERSION, architecture_module
from ..models._pipeline import load_pipeline
from ..text.chat_template import ChatTemplate, ChatTemplateError, normalize_messages
from ..text.tokenizer import Tokenizer, spm_merges_of
from ..tools.dialects import dialect_for
from ..tools.prompt import with_tools
from ..types import (
    MAX_CHOICES,
    BadSessionBlob,
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    ModelConfig,
    ModelLoadError,
    ServerBusy,
    ServerMemoryConstrained,
    ServerShuttingDown,
    SessionCapacity,
    TokenEvent,
    Usage,
)
from .embedding import default_pooling, embed_job, score_job
from .memory import CRITICAL, MemoryLadder, device_memory, host_memory
from .runner import Runner
from .scheduler import (
    REFUSED_MEMORY,
    Batch,
    Finished,
    QueueFull,
    Refused,
    Sampled,
    Scheduler,
    Started,
)
from .session_blob import KVLayout, SessionSnapshot
from .session_blob import decode as decode_blob
from .session_blob import encode as encode_blob
from .session_key import SessionKey
from .sessions import Conversation, Resume, SessionInfo, SessionTable
from .slot_cache import SlotContents

log = logging.getLogger("pantheon.engine.service")


HEADER_DOCUMENT = "gguf-header"


def _dies_for(config: ModelConfig) -> list:
    """The dies `config` places its layers on (kernels.devices.dies), or [] for host memory."""
    try:
        return dies.placement(config.dies, config.backend)
    except ValueError as exc:
        raise ModelLoadError(f"{config.name}: {exc}") from None


def _cache_key(version: str) -> str:
    return f"{version}-L{WEIGHT_LAYOUT_VERSION}"


def peek_gguf(path: str, weight_cache_dir: str = "") -> GGUFFile:
    """A GGUF's metadata and tensor index without loading it: from the weight cache when it
    holds these bytes' parsed header (no GGUFReader parse), else parsed. Writes nothing."""
    if weight_cache_dir and Path(path).is_file():
        version = file_weights_version(path)
        header = WeightCache(Path(weight_cache_dir), _cache_key(version), 0).read_json(
            HEADER_DOCUMENT
        )
        if isinstance(header, dict):
            return GGUFFile(path, header, weights_version=version)
    return GGUFFile(path)


def _open_gguf(config: ModelConfig) -> tuple[GGUFFile, WeightCache | None]:
    """The GGUF with its header parsed once (from the weight cache when that holds these
    bytes' header), and the cache entry for these bytes (None without a cache dir)."""
    if not config.weight_cache_dir:
        return GGUFFile(config.path), None
    if not Path(config.path).is_file():
        return GGUFFile(config.path), None  # raises the clear "not found"
    version = file_weights_version(config.path)
    cache = WeightCache(
        Path(config.weight_cache_dir),
        _cache_key(version),
        config.weight_cache_max_bytes,
    )
    parsed: list[GGUFFile] = []

    def parse() -> dict:
        parsed.append(GGUFFile(config.path, weights_version=version))
        return parsed[0].header()

    header = cache.get_json(HEADER_DOCUMENT, parse)
    gf = parsed[0] if parsed else GGUFFile(config.path, header, weights_version=version)
    return gf, cache


DEFAULT_CTX_CAP = 8192
MEMORY_POLL_S = 0.5  # how often the engine thread reads free memory for the ladder
IDLE_WAIT_S = 0.25  # an idle engine thread still wakes this often (queue timeouts, ladder)
MAX_RETRY_AFTER_S = 30
SESSION_REAP_S = 1.0  # how often the engine thread drops idle sessions
FALLBACK_PREFILL_TOK_PER_S = 100.0  # estimates before a prefill rate is measured


@dataclass(eq=False)
class _Request:
    """One admitted request, as the engine thread sees it."""

    request: GenerationRequest
    emit: Callable[[object], None]
    group_id: int = 0
    closed: bool = False  # its client is gone (or it failed): drop its events
    resume: Resume = Resume()  # where its prompt resumed from (session turns)
    # time.monotonic() when it reached the engine and when its slots were given (metrics)
    arrived_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None


@dataclass(eq=False)
class _Choice:
    """Decode and output state of one choice (one sequence); the engine thread's alone."""

    req: _Request
    index: int
    state: DecodeState  # how its next token is chosen
    out: ChoiceOutput  # what its tokens become for the client
    stopped: str | None = None  # the reason it was ended early (stop string, loop, grammar)
    first_token_at: float | None = None  # time.monotonic() of its first sampled token

    @property
    def token_ids(self) -> list[int]:
        return self.out.token_ids


@dataclass(frozen=True)
class ExportedSession:
    session_id: str
    weights_version: str
    tokens: tuple[int, ...]
    blob: bytes
    namespace: str = "open"  # whose session it is (serving/sessions.py)

    @property
    def n_tok(self) -> int:
        return len(self.tokens)


@dataclass
class EngineStats:
    """Measured rates, for estimates and /admin views. Written by the engine thread only."""

    prefill_tok_per_s: float = 0.0
    decode_tok_per_s: float = 0.0  # all sequences together, over the last decode step
    decode_step_s: float = 0.0  # smoothed seconds per decode step
    generations: int = 0


class ModelService:
    def __init__(self, config: ModelConfig, gf: GGUFFile, model, tokenizer: Tokenizer, template):
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
        self.stats = EngineStats()
        n_ctx_train = model.hp.n_ctx_train
        cap = config.ctx_cap if config.ctx_cap > 0 else min(n_ctx_train, DEFAULT_CTX_CAP)
        self.context_window_configured = min(cap, n_ctx_train)
        self.max_sessions = config.max_sessions
        # One KV slot per concurrently decoded sequence (the contract: 0 -> max_sessions).
        self.max_concurrent_configured = max(1, config.max_concurrent or config.max_sessions)
        self.kv = model.make_kv_cache(
            self.max_concurrent_configured, self.context_window_configured
        )
        # The dies the layers live on (kernels.devices.dies), and what serving holds there.
        self.placed_on = list(getattr(model, "dies", ()))
        self.dies = [d.ordinal for d in self.placed_on]
        if self.placed_on:
            model.hold(self.name, self.kv)
        # What free slots still hold (engine thread only): the prefix cache, and a
        # session's parked conversation in the slot it parked from (at most a quarter of
        # the slots: a 1.9k-token SmolLM2 prefix is 87 MB to copy back otherwise).
        self.slot_contents = SlotContents(
            max_positions=2 * self.context_window_configured,
            max_parked=self.max_concurrent_configured // 4,
            share=config.prefix_cache,
            max_spill_bytes=config.prefix_cache_ram_bytes,
        )
        self.ladder = MemoryLadder(
            self.max_concurrent_configured,
            self.context_window_configured,
            probe=self._die_memory if self.on_accelerator else host_memory,
        )
        self.scheduler = Scheduler(
            self.max_concurrent_configured,
            self.context_window_configured,
            prefill_chunk=config.prefill_chunk,
            queue_depth=config.queue_depth,
            queue_timeout_s=config.queue_timeout_s,
            end_ids=tokenizer.end_of_turn_ids,
            choose_slot=self.slot_contents.prefer,
        )
        self.runner = Runner(model, self.kv)
        self.sessions = SessionTable(
            config.max_sessions,
            idle_ttl_s=config.session_idle_ttl_s,
            watch_grace_s=config.session_watch_grace_s,
            max_watches=config.max_watches,
            key_max_sessions=config.key_max_sessions,
            key_max_watches=config.key_max_watches,
            implicit_ttl_s=config.session_implicit_ttl_s,
        )
        self._last_reap = 0.0
        self._lock = threading.Lock()  # guards scheduler and _requests
        self._requests: dict[int, _Request] = {}
        self._choices: dict[int, _Choice] = {}  # engine thread only
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._draining = False
        self._ladder_moved = False
        self._last_poll = 0.0
        self._trim_due = False  # work ran since the last malloc_trim
        # Jobs beside generation (embeddings, prompt scoring): (generator, future), run
        # one step each engine iteration, first come first served (submit).
        self._jobs: collections.deque[tuple[Generator, Future]] = collections.deque()
        self._thread = threading.Thread(target=self._run, name=f"engine-{self.name}", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, config: ModelConfig, on_progress: ProgressCallback | None = None) -> ModelService:
        """Open, dequantise and start serving a GGUF. Blocking; raises ModelLoadError.

        With `config.weight_cache_dir`, everything derived from the file (its parsed
        header, tokenizer merges, the prepared float32 tensors) comes from the weight cache
        when a valid entry for these bytes exists, and is stored there when not.
        `on_progress` is called on the loading thread after each step
        (loading/progress.py); the log gets a progress line every tenth or second."""
        t0 = time.perf_counter()
        progress = LoadReporter([ProgressLog(config.name), on_progress])
        progress.phase(PARSE)
        gf, cache = _open_gguf(config)
        progress.begin(len(gf.tensors), sum(gf.stored_bytes(n) for n in gf.tensors))
        with cache if cache is not None else contextlib.nullcontext():
            arch = architecture_module(gf.architecture)
            try:
                merges = (
                    cache.get_json("spm-merges", lambda: spm_merges_of(gf.metadata))
                    if cache is not None
                    else None
                )
                tokenizer = Tokenizer.from_gguf(gf.metadata, spm_merges=merges)
            except (NotImplementedError, KeyError, ValueError) as exc:
                raise ModelLoadError(f"{gf.path.name}: unusable tokenizer metadata: {exc}") from exc
            template = ChatTemplate.from_gguf(gf.metadata)
            if config.chat_template:  # the operator's template, with the GGUF's bos/eos texts
                try:
                    template = ChatTemplate(
                        config.chat_template,
                        bos_token=template.bos_token,
                        eos_token=template.eos_token,
                    )
                except ChatTemplateError as exc:
                    raise ModelLoadError(f"{config.name}: chat_template: {exc}") from exc
            placed = _dies_for(config)
            if placed:  # split by layers across dies, each stage on its die's thread
                model = load_pipeline(gf, arch.SPEC, placed, die_backend, progress, cache)
            else:
                try:
                    backend = get_backend(config.backend)
                except ValueError as exc:
                    raise ModelLoadError(f"{config.name}: {exc}") from None
                model = arch.load(gf, progress, cache, backend=backend, quantize=config.quantize)
            if cache is not None and cache.misses:
                progress.phase(CACHE_WRITE)  # published as the block exits
        progress.finish()
        svc = cls(config, gf, model, tokenizer, template)
        svc.load_seconds = round(time.perf_counter() - t0, 3)
        svc.weight_cache_used = cache is not None and cache.used
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
        scheduler and thread: a different configuration without loading the file again."""
        svc = type(self)(config, self.gguf, self.model, self.tokenizer, self.template)
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
        with self._lock:
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
        """Host memory this instance may hold: float32 weights plus its whole KV cache."""
        return self.model.weight_bytes + self.kv.nbytes

    # ---- request side (any thread / the event loop) ----

    @property
    def think_style(self) -> bool:
        """The chat template knows `<think>` blocks (reasoning is split from the answer)."""
        return is_think_template(self.template.source)

    @property
    def tool_dialect(self):
        """The tool-call dialect this model writes (tool_dialects.dialect_for): BOS is
        added when the template spells `bos_token` or the tokenizer prepends it."""
        adds_bos = self.tokenizer.add_bos or "bos_token" in self.template.source
        return dialect_for(self.name, self.architecture, adds_bos)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.prepare_chat(messages)[0]

    def prepare_chat(
        self,
        messages: list[dict],
        enable_thinking: bool = True,
        tools: list | None = None,
        dialect=None,
    ) -> tuple[list[int], bool]:
        """The prompt ids, and whether the answer starts inside a think block. With a
        think-style template, `enable_thinking` opens the block or prefills a closed one.
        With a tool `dialect`, the tools and the history's tool turns are rendered in it."""
        if dialect is not None:
            messages = with_tools(messages, tools or [], dialect)
        think = self.think_style
        extra = {"enable_thinking": enable_thinking} if think else {}
        text = self.template.render(
            normalize_messages(messages), add_generation_prompt=True, **extra
        )
        think_open = False
        if think:
            text += thinking_prompt_suffix(text, enable_thinking)
            think_open = enable_thinking
        return self._encode_prompt(text), think_open

    def encode_raw(self, text: str) -> list[int]:
        """A raw prompt's ids (no chat template): special tokens written in it recognised,
        BOS where the GGUF adds one. TooManyTokens when certain not to fit the window."""
        return self._encode_prompt(text)

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
        if self._draining:
            raise ServerShuttingDown(f"model {self.name!r} is shutting down; retry elsewhere")
        future: Future = Future()
        with self._lock:
            self._jobs.append((job, future))
        self._wake.set()
        return future

    def clear_prefix_cache(self) -> Future:
        """Forget the KV that free slots keep for prompts beginning the same way (their
        pages go back to the OS); the next prompts are computed whole. Resolves to the
        number of slots released."""

        def job():
            slots = self.slot_contents.clear()
            for slot in slots:
                self.kv.release(slot)
            return len(slots)
            yield  # a generator: submit() runs it on the engine thread

        return self.submit(job())

    def embed(self, token_lists: Sequence[Sequence[int]]) -> Future:
        """Embeddings of token lists, (N, D) float32 L2-normalised rows pooled as
        `self.pooling`: each list prefilled alone in `prefill_chunk` chunks on a scratch
        cache (no KV kept), so a row is the same bits alone or in a batch. Refusals
        (ContextOverBudget, ServerMemoryConstrained, ...) are raised here."""
        self._admissible(max((len(ids) for ids in token_lists), default=0))
        if any(not ids for ids in token_lists):
            raise GenerationFailed("empty input")
        return self.submit(
            embed_job(self.model, token_lists, self.pooling, self.config.prefill_chunk)
        )

    def score(self, ids: Sequence[int], top_n: int = 0) -> Future:
        """Each token's log-probability after the ones before it (raw logits), with the
        `top_n` most likely alternatives: [(logprob, ((id, logprob), ...))] for ids[1:]."""
        self._admissible(len(ids))
        return self.submit(score_job(self.model, ids, top_n, self.config.prefill_chunk))

    def grammar_tokenizer(self) -> GrammarTokenizer:
        """llguidance's view of this vocabulary (built on first use, then cached)."""
        return GrammarTokenizer.for_tokenizer(self.tokenizer)

    def _encode_prompt(self, text: str) -> list[int]:
        # A text certain to overflow the configured window is refused untokenized
        # (Tokenizer.TooManyTokens): a huge prompt costs no tokenizer time.
        ids = self.tokenizer.encode(text, limit=self.context_window_configured)
        bos = self.tokenizer.bos_id
        if self.tokenizer.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

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
        self._admissible(len(request.prompt_ids))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        req = _Request(request, emit=lambda ev: None)

        def emit(event: object) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                req.closed = True

        req.emit = emit
        n = max(1, min(request.n, MAX_CHOICES))
        session_id = request.session_id if self.sessions.enabled else None
        if session_id is not None:
            self._begin_session_turn(
                session_id, len(request.prompt_ids), implicit=request.session_implicit
            )
        with self._lock:
            try:
                req.group_id = self.scheduler.add(
                    request.prompt_ids, n, request.params.max_tokens, request.cache_namespace
                )
            except QueueFull as exc:
                if session_id is not None:
                    self.sessions.end_turn(session_id)
                retry = self._retry_after_locked()
                if self.ladder.level == CRITICAL:
                    raise ServerMemoryConstrained(
                        f"memory pressure is critical and the queue is full ({exc})", retry
                    ) from None
                raise ServerBusy(f"model {self.name!r} is busy: {exc}", retry) from None
            self._requests[req.group_id] = req
        self._wake.set()
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
            if not req.closed:
                with self._lock:  # closed and cancelled together: see _forget_closed
                    req.closed = True
                    self.scheduler.cancel(req.group_id)
                    self._requests.pop(req.group_id, None)
                self._wake.set()
            if session_id is not None:
                self.sessions.end_turn(session_id)

    def _begin_session_turn(self, session_id: str, n_prompt: int, *, implicit: bool) -> None:
        try:
            self.sessions.begin_turn(session_id, implicit=implicit)
        except SessionCapacity as exc:
            seconds, rate, measured = self.estimate_prefill_s(n_prompt)
            raise SessionCapacity(
                f"model {self.name!r}: {exc}; release one (POST /session/release) or retry "
                f"in {SessionCapacity.retry_after} s. Served without a session, this "
                f"{n_prompt}-token prompt would re-prefill in about {seconds:.1f} s "
                f"({rate:.0f} tokens/s{' measured' if measured else ', not yet measured'})."
            ) from None

    def _admissible(self, n_prompt: int) -> None:
        if self._draining:
            raise ServerShuttingDown(f"model {self.name!r} is shutting down; retry elsewhere")
        if n_prompt == 0:
            raise GenerationFailed("empty prompt")
        if n_prompt > self.context_window_configured:
            raise ContextOverBudget(n_prompt, self.context_window_configured)
        window = self.context_window
        if n_prompt > window:
            raise ServerMemoryConstrained(
                f"memory pressure: the context window is down to {window} tokens "
                f"(configured {self.context_window_configured}) and the prompt is "
                f"{n_prompt}; retry later",
                self._retry_after(),
            )
        needed = n_prompt * self.kv.bytes_per_token()
        available = self.ladder.available_bytes()
        if needed > available:
            raise ServerMemoryConstrained(
                f"memory pressure: the prompt's KV needs {needed >> 20} MiB and only "
                f"{available >> 20} MiB is free; retry later",
                self._retry_after(),
            )

    def _retry_after(self) -> int:
        with self._lock:
            return self._retry_after_locked()

    def _retry_after_locked(self) -> int:
        """Seconds until a request arriving now would likely get a slot: the scheduler's
        estimate (until a slot frees, plus a turnover of the slots per `served_slots`
        requests queued ahead) times the measured step time, between 1 and 30."""
        steps = self.scheduler.steps_until_admitted()
        step_s = self.stats.decode_step_s or 0.05
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(steps * step_s)))

    def simulate_memory_pressure(self, level: int | None) -> None:
        """Test hook (an operator route): pin the memory ladder at `level` (0 normal ..
        3 critical), or None to follow real free memory again. The served numbers change
        at once; running generations see the new limits at the engine's next step."""
        self.ladder.simulate(level)
        self._ladder_moved = True
        self._wake.set()

    # ---- sessions (any thread) ----

    @property
    def kv_layout(self) -> KVLayout:
        n_layer, n_kv_head, head_dim = self.kv.layout
        return KVLayout(self.architecture, self.weights_version, n_layer, n_kv_head, head_dim)

    def snapshot(self, key: SessionKey, conv: Conversation) -> SessionSnapshot:
        """One parked conversation as a blob's contents (export and the disk writer)."""
        return SessionSnapshot(
            self.kv_layout,
            conv.tokens,
            conv.k,
            conv.v,
            key.id,
            created=time.time(),
            namespace=key.namespace,
        )

    def export_session(self, session_id: str) -> ExportedSession:
        """The id's most recently used conversation as a portable blob (session_blob.py)
        that records the session's namespace. Raises SessionNotFound, SessionBusy (a turn
        in flight)."""
        key = SessionKey.of(session_id)
        conv = self.sessions.latest(key)
        blob = encode_blob(self.snapshot(key, conv))
        return ExportedSession(key.id, self.weights_version, conv.tokens, blob, key.namespace)

    def restore_session(self, session_id: str, blob: bytes, tokens: list[int] | None) -> int:
        """Install an exported conversation under `session_id` (a SessionKey: in its
        namespace, whatever namespace the blob records); returns its token count.

        Everything is checked before the table is touched: the blob itself (BadSessionBlob),
        the weights (WeightsVersionMismatch), the tokens sent with it, the window; then
        the table refuses a new id when full (SessionCapacity) or a busy one (SessionBusy).
        `tokens` None: take the blob's own (a spill file restored at start)."""
        snap = decode_blob(blob, self.kv_layout)
        if tokens is not None and tuple(tokens) != snap.tokens:
            raise BadSessionBlob(
                f"`tokens` ({len(tokens)}) are not the history the blob covers "
                f"({snap.n_tok} tokens): send back the tokens the export returned"
            )
        too_big = [t for t in snap.tokens if t >= self.tokenizer.vocab_size]
        if too_big:
            raise BadSessionBlob(
                f"the blob's tokens include id {too_big[0]}, outside this model's "
                f"{self.tokenizer.vocab_size}-token vocabulary"
            )
        if snap.n_tok > self.context_window_configured:
            raise BadSessionBlob(
                f"the blob holds {snap.n_tok} tokens; this model's context window is "
                f"{self.context_window_configured}"
            )
        self.sessions.install(session_id, Conversation(snap.tokens, snap.k, snap.v))
        return snap.n_tok

    def release_session(self, session_id: str) -> bool:
        """Free every conversation of the id now (idempotent); False if it held none."""
        return self.sessions.release(session_id)

    def session_info(self) -> list[SessionInfo]:
        return self.sessions.info()

    def estimate_prefill_s(self, tokens: int) -> tuple[float, float, bool]:
        """(seconds to prefill `tokens` cold, the rate used, whether it was measured)."""
        measured = self.stats.prefill_tok_per_s
        rate = measured or FALLBACK_PREFILL_TOK_PER_S
        return tokens / rate, rate, bool(measured)

    def begin_drain(self) -> None:
        """Admit nothing new (ServerShuttingDown); queued and running requests finish."""
        self._draining = True

    def set_queue_limits(self, depth: int, timeout_s: float) -> None:
        """A new queue depth and timeout (the runtime config), from the next request on:
        requests already queued keep their place."""
        with self._lock:
            self.scheduler.queue_depth = max(0, depth)
            self.scheduler.queue_timeout_s = timeout_s

    def close(self) -> None:
        """Stop the engine thread; requests still in flight fail with GenerationFailed."""
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout=30)
        if self.placed_on:
            self.model.release(self.kv)  # once: a second close() finds nothing held

    def _die_memory(self) -> tuple[int, int]:
        """(free, total) of the fullest die this model is on, as the ladder reads it."""
        return min((die.run(device_memory) for die in self.placed_on), default=(0, 0))

    # ---- engine thread ----

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._step()
            except Exception:  # a bug outside the forward pass: fail what runs, keep serving
                log.exception("%s: engine step failed", self.name)
                self._fail_all(GenerationFailed("generation failed: internal error"))
        self._fail_all(GenerationFailed(f"model {self.name!r} was unloaded"))
        self._fail_jobs(GenerationFailed(f"model {self.name!r} was unloaded"))

    def _advance_job(self) -> bool:
        """One step of the oldest job (a prefill chunk); False when there is none."""
        with self._lock:
            if not self._jobs:
                return False
            job, future = self._jobs.popleft()
        if future.cancelled():  # its caller is gone
            job.close()
            return True
        try:
            next(job)
        except StopIteration as done:
            _settle(future, result=done.value)
        except Exception as exc:
            log.exception("%s: a job failed", self.name)
            _settle(future, error=GenerationFailed(f"failed: {type(exc).__name__}"))
        else:
            with self._lock:
                self._jobs.appendleft((job, future))
        return True

    def _fail_jobs(self, error: Exception) -> None:
        with self._lock:
            jobs = list(self._jobs)
            self._jobs.clear()
        for job, future in jobs:
            job.close()
            _settle(future, error=error)

    def _step(self) -> None:
        """One iteration: admit, schedule, run, deliver (or wait when there is no work)."""
        self._poll_memory()
        self._reap_sessions()
        with self._lock:
            refused = self.scheduler.expire()
            started = self.scheduler.admit()
            self._start(started)
            resuming = [(s, self._requests.get(s.group_id)) for s in started]
        resumed = self._resume_prefixes(resuming)  # KV copies, outside the lock
        with self._lock:
            for group_id, cached in resumed:
                self.scheduler.resume(group_id, cached)
            batch = self.scheduler.plan(started)
            freed = self.scheduler.pop_freed_slots()
        self._release_freed(freed)
        self._deliver(refused)
        if self._advance_job():
            self._trim_due = True
            if batch.empty:
                return
        if batch.empty:
            if (
                self._trim_due
            ):  # idle after work: hand freed heap pages back (kernels/devices/threads)
                self._trim_due = not threads.trim()
            self._wake.wait(IDLE_WAIT_S)
            self._wake.clear()
            return
        states = {seq_id: ch.state for seq_id, ch in self._choices.items()}
        try:
            sampled = self.runner.run(batch, states)
        except Exception as exc:
            log.exception("%s: a forward pass failed", self.name)
            self._fail(batch, GenerationFailed(f"generation failed: {type(exc).__name__}"))
            return
        self._note_times()
        self._trim_due = True
        with self._lock:
            events = self.scheduler.update(batch, sampled)
        self._deliver(events)
        self._forget_closed()

    def _start(self, started_groups: list[Started]) -> None:
        """Output state for the groups this step admitted (under the lock)."""
        for started in started_groups:
            req = self._requests.get(started.group_id)
            if req is None:
                continue
            if req.admitted_at is None:
                req.admitted_at = time.monotonic()
            request = req.request
            params = request.params
            plan = request.constraint
            grammar = None
            if plan is not None and getattr(plan, "grammar", None):
                gtok = self.grammar_tokenizer()

                def grammar(plan=plan, gtok=gtok) -> Constraint:
                    return Constraint(plan, gtok)

            for index, seq_id in enumerate(started.seq_ids):
                seed = None if params.seed is None else params.seed + index
                state = DecodeState(Sampler(replace(params, seed=seed)), grammar)
                self._choices[seq_id] = _Choice(
                    req=req,
                    index=index,
                    state=state,
                    out=ChoiceOutput(request, index, self.tokenizer, state),
                )

    def _resume_prefixes(self, resuming) -> list[tuple[int, int]]:
        """Groups just admitted whose prompt begins with KV that exists already: a session
        turn's conversation (copied into the group's first slot unless that slot still
        holds it) and whatever that slot itself still holds (the prefix cache), whichever
        covers more. Returns (group id, cached tokens) to resume."""
        resumed = []
        for started, req in resuming:
            copy = self.slot_contents.copy_source(started.slots[0]) if started.slots else None
            if req is None or not started.slots:
                self.slot_contents.taken(started.slots)
                continue
            slot, prompt = started.slots[0], req.request.prompt_ids
            spill = self.slot_contents.spill_source(slot)
            if spill is not None:  # what the slot kept, to host memory before it is overwritten
                spill.k, spill.v = self.kv.save(slot, len(spill.tokens))
                self.slot_contents.spilled(spill, time.monotonic())
            cached = 0
            if copy is not None:  # a kept prefix another conversation's slot also holds
                source, cached = copy
                self.kv.copy_prefix(source, slot, cached)
            restore = self.slot_contents.restore_source(slot)
            if restore is not None:  # a prefix spilled to host memory earlier
                entry, n = restore
                self.kv.load(slot, entry.k, entry.v, n)
                cached = max(cached, n)
            sid = req.request.session_id
            if sid is not None and self.sessions.enabled:
                req.resume = self.sessions.match(sid, prompt)
                conv, resumed_n = req.resume.conversation, req.resume.cached
                if conv is not None and resumed_n > cached:
                    if self.slot_contents.parked_conversation(slot) is not conv:
                        self.kv.load(slot, conv.k, conv.v, resumed_n)
                    cached = resumed_n
            # Positions the slot holds for this prompt stay valid past a copy into it:
            # the copy wrote the same tokens' KV over the first of them.
            if self.config.prefix_cache:
                namespace = req.request.cache_namespace
                cached = max(cached, self.slot_contents.reusable(slot, prompt, namespace))
            if cached > 0:
                resumed.append((started.group_id, cached))
            self.slot_contents.taken(started.slots)  # overwritten from now on
        return resumed

    def _release_freed(self, freed: list[int]) -> None:
        """Hand back the KV pages of freed slots that hold nothing worth keeping, and of
        kept ones past the bounds (slot_cache); of a slot kept, the pages past what it
        keeps (an earlier, longer sequence's positions, read by no one)."""
        for slot in self.slot_contents.freed(freed, time.monotonic()):
            self.kv.release(slot)
        for slot in freed:
            kept = self.slot_contents.kept_positions(slot)
            if kept:
                self.kv.release(slot, keep=kept)

    def _keep_finished_kv(self, ch: _Choice, event: Finished) -> bool:
        """A choice ended: note what its slot holds (still intact: the slot is reused only
        at the next step) for the prefix cache; for choice 0 of a session turn, keep that
        KV as the session's newest conversation. Returns the session_conflict flag."""
        request = ch.req.request
        n_out = event.kv_written - len(request.prompt_ids)
        tokens = (*request.prompt_ids, *ch.token_ids[:n_out])
        if n_out < 0 or len(tokens) != event.kv_written or event.slot < 0:
            return False
        now = time.monotonic()
        if ch.index != 0 or request.session_id is None or not self.sessions.enabled:
            if self.config.prefix_cache:
                self.slot_contents.ended(event.slot, tokens, now, request.cache_namespace)
            return False
        k, v = self.kv.save(event.slot, event.kv_written)
        conversation = Conversation(tokens, k, v)
        self.slot_contents.ended(
            event.slot, tokens, now, request.cache_namespace, parked=conversation
        )
        return self.sessions.park(request.session_id, conversation, ch.req.resume)

    def _reap_sessions(self) -> None:
        now = time.monotonic()
        if now - self._last_reap < SESSION_REAP_S:
            return
        self._last_reap = now
        for sid in self.sessions.reap():
            log.info("%s: session %s dropped (idle)", self.name, _short(sid))

    def _deliver(self, events: list) -> None:
        for event in events:
            if isinstance(event, Sampled):
                self._on_token(event)
            elif isinstance(event, Finished):
                self._on_finished(event)
            elif isinstance(event, Refused):
                self._on_refused(event)

    def _on_token(self, event: Sampled) -> None:
        ch = self._choices.get(event.seq_id)
        if ch is None or ch.stopped or ch.req.closed:
            return
        if ch.first_token_at is None:
            ch.first_token_at = time.monotonic()
        token_event, end = ch.out.push(event.token_id)
        if token_event is not None:
            ch.req.emit(token_event)
        if end is not None:
            ch.stopped = end
            with self._lock:
                finished = self.scheduler.finish(event.seq_id, end)
            if finished is not None:  # else a Finished event for it follows in this batch
                self._on_finished(finished)

    def _on_finished(self, event: Finished) -> None:
        # The scheduler has freed the slot already: a client's next request is never
        # refused as busy by the one it just saw finish.
        if event.group_done:
            with self._lock:
                self._requests.pop(event.group_id, None)
            self.stats.generations += 1
        ch = self._choices.pop(event.seq_id, None)
        if ch is None or ch.req.closed:
            return
        conflict = self._keep_finished_kv(ch, event)
        tail = ch.out.finish(ended_by_model=ch.stopped is None and event.reason == "stop")
        reason = ch.out.finish_reason(ch.stopped or event.reason)
        if tail is not None:
            ch.req.emit(tail)
        usage = Usage(
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            cached_tokens=event.cached_tokens,
            kv_used=event.kv_used,
            kv_cap=event.kv_cap,
            session_conflict=conflict,
            reasoning_tokens=ch.out.reasoning_tokens,
        )
        finish = FinishEvent(
            finish_reason=reason,
            usage=usage,
            index=ch.index,
            choices=event.choices,
            tool_calls=ch.out.parsed_calls,
            tool_call_errors=ch.out.call_errors,
            stop_sequence=ch.out.stops.matched if ch.out.stopped_by_string else "",
            **_timings(ch),
        )
        # The answer's schema check (response_format) runs off this thread: the finish
        # leaves once it is settled, at once when there is nothing to check.
        ch.out.settle_format(
            lambda status, message: ch.req.emit(
                replace(finish, response_format_status=status, response_format_message=message)
            )
        )

    def _on_refused(self, event: Refused) -> None:
        with self._lock:
            req = self._requests.pop(event.group_id, None)
        if req is None or req.closed:
            return
        req.closed = True
        retry = self._retry_after()
        if event.reason == REFUSED_MEMORY:
            req.emit(ServerMemoryConstrained(event.message, retry))
        else:
            req.emit(ServerBusy(f"model {self.name!r} is busy: {event.message}", retry))

    def _fail(self, batch: Batch, error: Exception) -> None:
        """A step failed: every request with a sequence in it fails (its slots freed)."""
        seq_ids = {c.seq_id for c in batch.prefill} | set(batch.sampling_seq_ids())
        reqs = {id(ch.req): ch.req for s in seq_ids if (ch := self._choices.get(s))}
        for req in reqs.values():
            with self._lock:
                self.scheduler.cancel(req.group_id)
                self._requests.pop(req.group_id, None)
            if not req.closed:
                req.closed = True
                req.emit(error)
        self._forget_closed()

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            reqs = list(self._requests.values())
            self._requests.clear()
            for req in reqs:
                self.scheduler.cancel(req.group_id)
        for req in reqs:
            if not req.closed:
                req.closed = True
                req.emit(error)

    def _forget_closed(self) -> None:
        """Drop the output state of requests nobody listens to any more, cancelling them
        first (idempotent), so that no later batch can include their sequences."""
        closed = {id(ch.req): ch.req for ch in self._choices.values() if ch.req.closed}
        if not closed:
            return
        with self._lock:
            for req in closed.values():
                self.scheduler.cancel(req.group_id)
                self._requests.pop(req.group_id, None)
        for seq_id in [s for s, ch in self._choices.items() if ch.req.closed]:
            del self._choices[seq_id]

    def _poll_memory(self) -> None:
        """Move the ladder (every MEMORY_POLL_S, or at once after a simulated move) and
        hand the scheduler whatever it serves now."""
        now = time.monotonic()
        if self._ladder_moved or now - self._last_poll >= MEMORY_POLL_S:
            self._ladder_moved = False
            self._last_poll = now
            self.ladder.observe()
        slots, window = self.ladder.slots, self.ladder.window
        if (slots, window) == (self.scheduler.served_slots, self.scheduler.context_window):
            return
        log.warning(
            "%s: memory pressure %s: serving %d of %d slots, a %d-token window of %d",
            self.name,
            self.ladder.level_name,
            slots,
            self.max_concurrent_configured,
            window,
            self.context_window_configured,
        )
        with self._lock:
            events = self.scheduler.set_limits(slots, window)
        self._deliver(events)
        for slot in self.slot_contents.clear():  # kept prefixes are the first to go
            self.kv.release(slot)

    def _note_times(self) -> None:
        t = self.runner.last
        if t.prefill_tokens >= 32 and t.prefill_s > 0:
            self.stats.prefill_tok_per_s = t.prefill_tokens / t.prefill_s
        if t.decode_rows and t.decode_s > 0:
            self.stats.decode_tok_per_s = t.decode_rows / t.decode_s
            prev = self.stats.decode_step_s
            self.stats.decode_step_s = t.decode_s if not prev else 0.8 * prev + 0.2 * t.decode_s


def _timings(ch: _Choice) -> dict[str, float]:
    """A finishing choice's times for its FinishEvent (queue_wait_s, first_token_s,
    decode_s); a choice that sampled no token has a first token "now"."""
    now = time.monotonic()
    req = ch.req
    first = ch.first_token_at if ch.first_token_at is not None else now
    admitted = req.admitted_at if req.admitted_at is not None else req.arrived_at
    return {
        "queue_wait_s": admitted - req.arrived_at,
        "first_token_s": first - req.arrived_at,
        "decode_s": now - first,
    }


def _settle(future: Future, result: object = None, error: Exception | None = None) -> None:
    """Complete a job's future, unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def _short(session_id: str) -> str:
    """A session id for the log: its first characters only (ids may be secrets)."""
    return session_id[:6] + "…" if len(session_id) > 8 else session_id
