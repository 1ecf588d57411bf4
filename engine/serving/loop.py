"""The engine thread of one model instance, and the state it shares with the handlers.

The thread owns the weights' forward passes, the KV cache and what free slots keep. Each
step (`_step`): admit what fits (scheduler.py), resume admitted prompts from KV that
exists already (a session's conversation, a kept prefix), plan the step's Batch, run it
(runner.py), deliver the events (each request's tokens and finish, pushed to its event
loop by the request's `emit`). Between steps it advances one job (jobs.py). The
scheduler's bookkeeping and the request table are shared with the handlers (admission,
cancellation) under one lock, held for microseconds; arrays and forward passes are the
thread's alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace

from kernels.devices import threads

from ..decoding.constraints import Constraint, GrammarTokenizer
from ..decoding.output import ChoiceOutput
from ..decoding.sampler import Sampler, ends_banned
from ..decoding.state import DecodeState
from ..foreground import FOREGROUND
from ..text.tokenizer import Tokenizer
from ..types import (
    FinishEvent,
    GenerationFailed,
    ModelConfig,
    ServerBusy,
    ServerMemoryConstrained,
    Usage,
)
from .admission import retry_after_s
from .batch import REFUSED_MEMORY, Batch, Finished, Refused, Sampled, Started
from .draft_model import DraftModel, DraftSlots
from .jobs import JobQueue
from .memory import MemoryLadder
from .records import Choice, EngineRequest, EngineStats, hand_over_due
from .runner import Runner
from .scheduler import Scheduler
from .sessions import SessionTable
from .slot_cache import SlotContents
from .slot_keeper import SlotKeeper
from .speculation import Speculator

log = logging.getLogger("pantheon.engine.service")

MEMORY_POLL_S = 0.5  # how often the engine thread reads free memory for the ladder
IDLE_WAIT_S = 0.25  # an idle engine thread still wakes this often (queue timeouts, ladder)
SESSION_REAP_S = 1.0  # how often the engine thread drops idle sessions
JOB_MAX_SKIPS = 3  # a side job yields to prompt prefills at most this many steps in a row


class EngineLoop:
    """One instance's engine thread, with the scheduler, runner, slot cache and session
    table it owns. `slots` and `window` are the configured KV slots and context window;
    the ladder says what is served of them now."""

    def __init__(
        self,
        name: str,
        config: ModelConfig,
        model,
        kv,
        tokenizer: Tokenizer,
        ladder: MemoryLadder,
        *,
        slots: int,
        window: int,
        draft: DraftModel | None = None,
    ):
        self.name = name
        self.tokenizer = tokenizer
        self.ladder = ladder
        self.slots_configured = slots
        self.window_configured = window
        self.stats = EngineStats()
        # What free slots still hold (engine thread only): the prefix cache, and a
        # session's parked conversation in the slot it parked from (at most a quarter of
        # the slots: a 1.9k-token SmolLM2 prefix is 87 MB to copy back otherwise).
        self.slot_contents = SlotContents(
            max_positions=2 * window,
            max_parked=slots // 4,
            share=config.prefix_cache,
            max_spill_bytes=config.prefix_cache_ram_bytes,
        )
        self.scheduler = Scheduler(
            slots,
            window,
            prefill_chunk=config.prefill_chunk,
            queue_depth=config.queue_depth,
            queue_timeout_s=config.queue_timeout_s,
            end_ids=tokenizer.end_of_turn_ids,
            choose_slot=self.slot_contents.prefer,
            batch_share=config.batch_share,
        )
        self.runner = Runner(model, kv)
        self.speculator = Speculator(
            config.speculation,
            config.spec_max_draft,
            tokenizer.end_of_turn_ids,
            DraftSlots.of(draft, config.speculation, tokenizer, slots, window),
        )
        self.sessions = SessionTable(
            config.max_sessions,
            idle_ttl_s=config.session_idle_ttl_s,
            watch_grace_s=config.session_watch_grace_s,
            max_watches=config.max_watches,
            key_max_sessions=config.key_max_sessions,
            key_max_watches=config.key_max_watches,
            implicit_ttl_s=config.session_implicit_ttl_s,
        )
        self.keeper = SlotKeeper(kv, self.slot_contents, self.sessions, config.prefix_cache)
        self._last_reap = 0.0
        self.lock = threading.Lock()  # guards scheduler, requests and the job queue
        self.requests: dict[int, EngineRequest] = {}
        self._choices: dict[int, Choice] = {}  # engine thread only
        self._posted: list[EngineRequest] = []  # requests with token events to flush
        self.stream_interval_s = config.stream_interval_s  # records.hand_over_due
        self.wake = threading.Event()
        self._closing = threading.Event()
        self._ladder_moved = False
        self._last_poll = 0.0
        self._trim_due = False  # work ran since the last malloc_trim
        # Jobs beside generation (embeddings, prompt scoring): run one step each engine
        # iteration, first come first served (submit).
        self.jobs = JobQueue(name, self.lock)
        self._job_skips = 0  # iterations in a row whose job step yielded to a prefill
        self.thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop the engine thread; requests still in flight fail with GenerationFailed."""
        self._closing.set()
        self.wake.set()
        self.thread.join(timeout=30)

    # ---- any thread ----

    def submit(self, job):
        """Run `job` on the engine thread (jobs.py); returns its Future."""
        future = self.jobs.submit(job)
        self.wake.set()
        return future

    def withdraw(self, req: EngineRequest) -> None:
        """Its stream ended or its client is gone: out of the queue, or its generation
        aborted at the next step (idempotent)."""
        if not req.closed:
            with self.lock:  # closed and cancelled together: see _forget_closed
                req.closed = True
                self.scheduler.cancel(req.group_id)
                self.requests.pop(req.group_id, None)
            self.wake.set()

    def ladder_moved(self) -> None:
        """The ladder was moved by hand: apply it at the next step, not the next poll."""
        self._ladder_moved = True
        self.wake.set()

    def retry_after(self) -> int:
        with self.lock:
            return retry_after_s(self.scheduler, self.stats)

    # ---- the engine thread ----

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._step()
            except Exception:  # a bug outside the forward pass: fail what runs, keep serving
                log.exception("%s: engine step failed", self.name)
                self._fail_all(GenerationFailed("generation failed: internal error"))
        self._fail_all(GenerationFailed(f"model {self.name!r} was unloaded"))
        self.jobs.fail_all(GenerationFailed(f"model {self.name!r} was unloaded"))

    def _step(self) -> None:
        """One iteration: admit, resume, plan, run, deliver (or a job, or wait when idle)."""
        self._poll_memory()
        self._reap_sessions()
        with self.lock:
            refused = self.scheduler.expire()
            started = self.scheduler.admit()
            moves = self.scheduler.lane.pop_moves()  # batch sequences parked, unparked
            self._start(started)
            resuming = [(s, self.requests.get(s.group_id)) for s in started]
        resumed = self.keeper.resume_prefixes(resuming, moves)  # KV copies, outside the lock
        with self.lock:
            for group_id, cached in resumed:
                self.scheduler.resume(group_id, cached)
            batch = self.scheduler.plan(started)
            freed = self.scheduler.pop_freed_slots()
        self.keeper.release_freed(freed)
        self._deliver(refused)
        if self._job_turn(batch) and self.jobs.advance():
            self._trim_due = True
            if batch.empty:
                return
        if batch.empty:
            self._posted = hand_over_due(self._posted, 0.0)  # nothing waits on a next step
            if self._trim_due:  # idle after work: freed heap pages back (devices/threads)
                self._trim_due = not threads.trim()
            self.wake.wait(IDLE_WAIT_S)
            self.wake.clear()
            return
        states = {seq_id: ch.state for seq_id, ch in self._choices.items()}
        drafts = self.speculator.drafts(batch.decode, self._choices, self._draft_rooms)
        try:
            # A prefill pass has someone waiting for a first token: bulk work elsewhere
            # steps aside, its temporaries reuse heap pages (_prefilling).
            with _prefilling() if batch.prefill else contextlib.nullcontext():
                sampled = self.runner.run(batch, states, drafts)
        except Exception as exc:
            log.exception("%s: a forward pass failed", self.name)
            self._fail(batch, GenerationFailed(f"generation failed: {type(exc).__name__}"))
            return
        self.stats.note_times(self.runner.last, self.speculator.costs)
        self._trim_due = True
        with self.lock:
            events = self.scheduler.update(batch, sampled)
        self._deliver_step(batch, events)
        self._forget_closed()

    def _job_turn(self, batch: Batch) -> bool:
        """Whether a side job (jobs.py) steps this iteration: not while a prompt is
        prefilled (a first token waits on this step), but at least once every
        JOB_MAX_SKIPS + 1 iterations, so a stream of new prompts never stalls the jobs."""
        if batch.prefill and self._job_skips < JOB_MAX_SKIPS:
            self._job_skips += 1
            return False
        self._job_skips = 0
        return True

    def _draft_rooms(self, seq_ids) -> dict[int, int]:
        with self.lock:
            return {s: self.scheduler.draft_room(s) for s in seq_ids}

    def _deliver_step(self, batch: Batch, events: list) -> None:
        """A step's events; where it verified drafts (speculation.py), one round at a time
        (round j: each sequence's j-th token), the scheduler updated per round and each
        token's decode state replayed before the output sees it: a stop string, the token
        limit or the grammar ends a sequence where one-token steps would have."""
        verified = self.runner.verified
        self.speculator.observe(verified, self._choices, self.stats)
        j = 0
        while True:
            for seq_id, done in verified.items():
                if j < len(done.tokens) and (ch := self._choices.get(seq_id)) is not None:
                    ch.state.replay(done.marks[j])
            self._deliver(events, flush=False)
            j += 1
            tokens = {
                s: done.tokens[j]
                for s, done in verified.items()
                if j < len(done.tokens) and (ch := self._choices.get(s)) and not ch.stopped
            }
            if not tokens:
                break
            rows = tuple(row for row in batch.decode if row.seq_id in tokens)
            with self.lock:
                events = self.scheduler.update(Batch(decode=rows), tokens)
        for seq_id in verified:
            if (ch := self._choices.get(seq_id)) is not None:
                ch.state.replay(None)
        self._posted = hand_over_due(self._posted, self.stream_interval_s)

    def _start(self, started_groups: list[Started]) -> None:
        """Output state for the groups this step admitted (under the lock)."""
        for started in started_groups:
            req = self.requests.get(started.group_id)
            if req is None:
                continue
            if req.admitted_at is None:
                req.admitted_at = time.monotonic()
            request = req.request
            params = request.params
            plan = request.constraint
            grammar = None
            if plan is not None and getattr(plan, "grammar", None):
                gtok = GrammarTokenizer.for_tokenizer(self.tokenizer)

                def grammar(plan=plan, gtok=gtok) -> Constraint:
                    return Constraint(plan, gtok)

            params = ends_banned(params, self.tokenizer.end_of_turn_ids)
            for index, seq_id in enumerate(started.seq_ids):
                seed = None if params.seed is None else params.seed + index
                state = DecodeState(Sampler(replace(params, seed=seed)), grammar)
                out = ChoiceOutput(request, index, self.tokenizer, state)
                self._choices[seq_id] = Choice(
                    req=req,
                    index=index,
                    state=state,
                    out=out,
                    drafter=self.speculator.drafter(request, out.token_ids),
                )

    def _reap_sessions(self) -> None:
        if (now := time.monotonic()) - self._last_reap >= SESSION_REAP_S:
            self._last_reap = now
            for sid in self.sessions.reap():
                log.info("%s: session %s dropped (idle)", self.name, _short(sid))

    def _deliver(self, events: list, flush: bool = True) -> None:
        for event in events:
            if isinstance(event, Sampled):
                self._on_token(event)
            elif isinstance(event, Finished):
                self._on_finished(event)
            elif isinstance(event, Refused):
                self._on_refused(event)
        if flush:
            self._posted = hand_over_due(self._posted, self.stream_interval_s)

    def _on_token(self, event: Sampled) -> None:
        ch = self._choices.get(event.seq_id)
        if ch is None or ch.stopped or ch.req.closed:
            return
        if ch.first_token_at is None:
            ch.first_token_at = time.monotonic()
        token_event, end = ch.out.push(event.token_id)
        if token_event is not None:
            if not ch.req.outbox:  # listed once per flush, however many tokens it posts
                self._posted.append(ch.req)
            ch.req.post(token_event)
        if end is not None:
            ch.stopped = end
            with self.lock:
                finished = self.scheduler.finish(event.seq_id, end)
            if finished is not None:  # else a Finished event for it follows in this batch
                self._on_finished(finished)

    def _on_finished(self, event: Finished) -> None:
        # The scheduler has freed the slot already: a client's next request is never
        # refused as busy by the one it just saw finish.
        if event.group_done:
            with self.lock:
                self.requests.pop(event.group_id, None)
            self.stats.generations += 1
        ch = self._choices.pop(event.seq_id, None)
        if ch is None or ch.req.closed:
            return
        conflict = self.keeper.keep_finished(ch.req, ch.index, ch.token_ids, event)
        tail = ch.out.finish(ended_by_model=ch.stopped is None and event.reason == "stop")
        reason = ch.out.finish_reason(ch.stopped or event.reason)
        ch.req.flush()  # the finish may leave from another thread (settle_format)
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
            accepted_prediction_tokens=ch.drafter.accepted_prediction if ch.drafter else 0,
            rejected_prediction_tokens=ch.drafter.rejected_prediction if ch.drafter else 0,
            truncated_messages=ch.req.request.truncated_messages,
        )
        finish = FinishEvent(
            finish_reason=reason,
            usage=usage,
            index=ch.index,
            choices=event.choices,
            tool_calls=ch.out.parsed_calls,
            tool_call_errors=ch.out.call_errors,
            stop_sequence=ch.out.stops.matched if ch.out.stopped_by_string else "",
            **ch.timings(),
        )
        # The answer's schema check (response_format) runs off this thread: the finish
        # leaves once it is settled, at once when there is nothing to check.
        ch.out.settle_format(
            lambda status, message: ch.req.emit(
                replace(finish, response_format_status=status, response_format_message=message)
            )
        )

    def _on_refused(self, event: Refused) -> None:
        with self.lock:
            req = self.requests.pop(event.group_id, None)
        if req is None or req.closed:
            return
        req.closed = True
        retry = self.retry_after()
        if event.reason == REFUSED_MEMORY:
            req.send(ServerMemoryConstrained(event.message, retry))
        else:
            req.send(ServerBusy(f"model {self.name!r} is busy: {event.message}", retry))

    def _fail(self, batch: Batch, error: Exception) -> None:
        """A step failed: every request with a sequence in it fails (its slots freed)."""
        seq_ids = {c.seq_id for c in batch.prefill} | set(batch.sampling_seq_ids())
        reqs = {id(ch.req): ch.req for s in seq_ids if (ch := self._choices.get(s))}
        for req in reqs.values():
            with self.lock:
                self.scheduler.cancel(req.group_id)
                self.requests.pop(req.group_id, None)
            if not req.closed:
                req.closed = True
                req.send(error)
        self._forget_closed()

    def _fail_all(self, error: Exception) -> None:
        with self.lock:
            reqs = list(self.requests.values())
            self.requests.clear()
            for req in reqs:
                self.scheduler.cancel(req.group_id)
        for req in reqs:
            if not req.closed:
                req.closed = True
                req.send(error)

    def _forget_closed(self) -> None:
        """Drop the output state of requests nobody listens to any more, cancelling them
        first (idempotent), so that no later batch can include their sequences."""
        closed = {id(ch.req): ch.req for ch in self._choices.values() if ch.req.closed}
        if not closed:
            return
        with self.lock:
            for req in closed.values():
                self.scheduler.cancel(req.group_id)
                self.requests.pop(req.group_id, None)
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
            self.slots_configured,
            window,
            self.window_configured,
        )
        with self.lock:
            events = self.scheduler.set_limits(slots, window)
        self._deliver(events)
        self.keeper.clear()  # kept prefixes are the first to go


def _short(session_id: str) -> str:
    """A session id for the log: its first characters only (ids may be secrets)."""
    return session_id[:6] + "…" if len(session_id) > 8 else session_id


@contextlib.contextmanager
def _prefilling():
    """A prefill pass: bulk work in the process (a huge text's tokenization) steps aside
    meanwhile (foreground.py), and its big temporaries reuse heap pages (threads.py)."""
    with FOREGROUND.running(), threads.prefill_heap():
        yield
