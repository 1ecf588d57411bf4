"""The batch runner: a thread of the server process with its own event loop that moves
batches through OpenAI's states and runs their lines, a few at a time
(PANTHEON_BATCH_CONCURRENCY, all batches together), each through dispatch.run_line in
the `batch` priority class. Nothing starts while no model is served (a restart still
loading) or the server drains; a line answered 429 or 503 is not an error line but
pending again, tried after a pause.

Durable: a line is claimed (running) before it runs and done, with its output line, in
one transaction after; the output and error files are appended to after that commit.
When a runner starts, lines left running by the last one (a crash) are pending again,
and each in-progress batch's files are rewritten from the done lines: a line that
finished is never run twice and never written twice. Cancel: the lines in flight are
stopped (their engine requests end at the next step) and pending again; what finished
stays, the batch ends as cancelled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading

from django.conf import settings
from django.db import OperationalError
from django.utils import timezone

from observability.metrics import BATCH_LINES
from pantheon_platform import shutdown
from pantheon_platform.db_thread import DatabaseBusy
from pantheon_platform.runtime import get_runtime
from wire.batches import store, validate
from wire.batches.dispatch import run_line
from wire.batches.models import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    EXPIRED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    Batch,
)
from wire.files import storage as files
from wire.files.storage import db

log = logging.getLogger("pantheon.batches")

POLL_S = 0.5  # how often the runner looks for new, cancelled or finished batches
LOCKED_RETRIES = 20
# Answers that say the server, not the line, could not do it now (busy, no model loaded
# yet, draining): the line is pending again and lines start again after a pause.
RETRIED_STATUSES = (429, 503)
RETRY_PAUSE_S = 1.0
EXPIRED_MESSAGE = "the batch's completion window ended before this line ran"

_runner: BatchRunner | None = None


def start() -> BatchRunner:
    """The process's runner, started once (pantheon_site/asgi.py)."""
    global _runner
    if _runner is None:
        _runner = BatchRunner()
        _runner.start()
    return _runner


def wake() -> None:
    """The process's runner looks at the batches now (a create or a cancel)."""
    if _runner is not None:
        _runner.wake()


class BatchRunner:
    def __init__(self, app=None, concurrency: int | None = None, poll_s: float = POLL_S):
        self._app = app
        self.concurrency = concurrency or settings.PANTHEON_BATCH_CONCURRENCY
        self.poll_s = poll_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Event | None = None
        self._paused_until = 0.0  # loop time: no line starts before (a 429 or 503 came)
        # batch id -> {line row id: its task}; the batches whose files this runner has
        # rewritten from the database (once each, when it first sees them in progress).
        self._flying: dict[str, dict[int, asyncio.Task]] = {}
        self._opened: set[str] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="batch-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop now, as a crash would: lines in flight stay `running` in the database
        (the next runner redoes them)."""
        self._stopping.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Look at the batches now (a create or cancel), not at the next poll."""
        loop, woken = self._loop, self._woken
        if loop is not None and woken is not None and not loop.is_closed():
            loop.call_soon_threadsafe(woken.set)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()
        if self._app is None:
            from django.core.handlers.asgi import ASGIHandler

            self._app = ASGIHandler()
        recovered = await db(store.recover)
        if recovered:
            log.info("batches: %d lines in flight at the last stop will be redone", recovered)
        while not self._stopping.is_set():
            try:
                await self._pass()
            except Exception:
                log.exception("batches: a runner pass failed")
            try:
                await asyncio.wait_for(self._woken.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._woken.clear()
        for tasks in self._flying.values():
            for task in tasks.values():
                task.cancel()
        tasks = [t for ts in self._flying.values() for t in ts.values()]
        await asyncio.gather(*tasks, return_exceptions=True)

    def _ready(self) -> bool:
        """Whether lines may start now: a model is served, the server is not draining,
        and no line was just answered busy or unavailable (then after a pause)."""
        if shutdown.draining() or not get_runtime().services():
            return False
        return self._loop.time() >= self._paused_until

    async def _pass(self) -> None:
        ready = self._ready()
        for batch in await db(store.active):
            if batch.status == VALIDATING:
                if not ready:  # a model named may be loading still
                    continue
                await db(validate.validate, batch)
            elif batch.status == CANCELLING:
                await self._stop_lines(batch.id)
                await self._end(batch.id, CANCELLED)
            elif batch.status == FINALIZING:
                await self._end(batch.id, COMPLETED)
            elif batch.status == IN_PROGRESS:
                await self._advance(batch, ready)

    async def _advance(self, batch: Batch, ready: bool) -> None:
        if batch.id not in self._opened:
            await db(_rewrite_outputs, batch)
            self._opened.add(batch.id)
        flying = self._flying.setdefault(batch.id, {})
        for line_id in [i for i, t in flying.items() if t.done()]:
            del flying[line_id]
        if timezone.now() >= batch.expires_at:
            await self._stop_lines(batch.id)
            lines = await db(store.fail_pending, batch.id, "batch_expired", EXPIRED_MESSAGE)
            await db(_append_all, batch.error_file_id, lines)
            await self._end(batch.id, EXPIRED)
            return
        room = self.concurrency - sum(len(f) for f in self._flying.values())
        if room > 0 and ready:
            for line_id, url, custom_id, body in await db(store.claim, batch.id, room):
                task = self._line(batch, line_id, url, custom_id, body)
                flying[line_id] = asyncio.create_task(task)
        if not flying and not await db(store.pending_count, batch.id):
            await db(store.set_status, batch.id, FINALIZING)
            await self._end(batch.id, COMPLETED)

    async def _line(self, batch: Batch, line_id: int, url: str, custom_id: str, body: dict):
        BATCH_LINES.labels("started").inc()
        try:
            ok, result = await run_line(self._app, url, batch.namespace, custom_id, body)
            status = (result.get("response") or {}).get("status_code")
            if status in RETRIED_STATUSES:  # busy, loading, draining: not the line's fault
                self._paused_until = self._loop.time() + RETRY_PAUSE_S
                await db(store.unclaim, [line_id])
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the handler answers errors itself; this is a bug
            log.exception("batches: line %s of %s failed", custom_id, batch.id)
            ok, result = False, store.error_line(custom_id, "server_error", str(exc))
        try:
            if await _retrying(store.finish_line, batch.id, line_id, ok, result):
                BATCH_LINES.labels("completed" if ok else "failed").inc()
                file_id = batch.output_file_id if ok else batch.error_file_id
                await _retrying(files.append, file_id, _jsonl(result))
        except (OperationalError, DatabaseBusy):  # the database stayed locked: run it again
            log.exception("batches: line %s of %s not recorded", custom_id, batch.id)
            await db(store.unclaim, [line_id])

    async def _stop_lines(self, batch_id: str) -> None:
        """Stop the batch's lines in flight (their engine requests end at the next step);
        they are pending again."""
        flying = self._flying.pop(batch_id, {})
        for task in flying.values():
            task.cancel()
        await asyncio.gather(*flying.values(), return_exceptions=True)
        await db(store.unclaim, list(flying))

    async def _end(self, batch_id: str, status: str) -> None:
        batch = await db(lambda: Batch.objects.get(id=batch_id))
        # The files exactly as the database says: a line whose commit raced a cancel
        # is in them once, whatever the appends did.
        await _retrying(_rewrite_outputs, batch)
        await _retrying(store.drop_empty_outputs, batch)
        await db(store.set_status, batch_id, status)
        self._flying.pop(batch_id, None)
        self._opened.discard(batch_id)


async def _retrying(work, *args):
    """`work(*args)` through db, retried while the database is locked by another writer
    (SQLite): a finished line is not lost to a busy moment."""
    for attempt in range(LOCKED_RETRIES):
        try:
            return await db(work, *args)
        except (OperationalError, DatabaseBusy):
            if attempt == LOCKED_RETRIES - 1:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))


def _jsonl(line: dict) -> bytes:
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _rewrite_outputs(batch: Batch) -> None:
    """The batch's files as the database says (a resumed batch: nothing twice)."""
    for file_id, ok in ((batch.output_file_id, True), (batch.error_file_id, False)):
        if file_id:
            files.rewrite(file_id, [_jsonl(r) for r in store.done_lines(batch.id, ok)])


def _append_all(file_id: str | None, lines: list[dict]) -> None:
    for line in lines:
        if file_id:
            files.append(file_id, _jsonl(line))
