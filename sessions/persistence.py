"""Sessions survive a restart, a graceful one or a kill: written to disk in the
background as turns park them, spilled whole at shutdown and unload, restored at load.

Layout: DATA_DIR/sessions/<model folder>/<stem>-<i>.pnkv, one file per conversation (i
counts a session's conversations, least recently used first), each a session blob
(engine.serving.session_blob) whose header names the session id and its
namespace (the API key that owns it): the file name never reveals either. The stem is a
hash of the session's key (`file_stem`). The model folder is the served name made
filesystem-safe plus a short hash of the exact name, so two names never share a folder.

- Background writes (`DurableWriter`, attached to a model at its load): the session
  table calls its listener when a turn parks a conversation, a restore installs one, or
  a session is released or dropped. On the engine thread that is only a note in a queue;
  the writer thread then writes that session's conversations (those not already on disk)
  atomically and deletes its files past the count it holds, or all of them when the
  session is gone. A session noted again before the writer reached it is written once.
  A note waits until its model has been left idle WRITE_AFTER_S after it (a client's next
  turn usually comes sooner: encoding and writing tens of MB beside that turn's prefill
  slowed its first token), and never longer than WRITE_WITHIN_S.
  So a SIGKILL loses at most a session's last turn (one still queued or being written).
- Shutdown (`spill_on_exit`, an pantheon_platform.shutdown before-exit hook, after the drain):
  the writer stops; every conversation of every served model is written atomically (temp
  file in the same folder, fsync, rename, fsync of the folder); then the files of that
  model that the new spill did not write are deleted. Sessions are written most recently
  used first.
- Unload or eviction (`spill_on_unload`, a runtime unload hook, after the model's
  generations drained): the writer lets go of the model, then the same spill for that
  one model, so that loading the name again (an operator, or the next LRU swap) brings
  its sessions back.
- Load (`restore_on_load`, a runtime load hook: it runs before the model is routable):
  each file, oldest first, is checked and installed with `svc.restore_session` under the
  key its header names (a blob without a namespace: the open one), which validates
  everything before it touches the session table, so a file is restored whole or not at
  all. A restored file stays (a file named by an older scheme is deleted: the writer
  writes the session again under its stem). A file that fails (unreadable, corrupt,
  truncated, other weights, no free session slot...) is moved to rejected/ with a
  .reason.txt next to it and a warning in the log. Stray temp files of an interrupted
  write are removed. Then the writer is attached and every restored session queued, so
  that the folder holds exactly what the table holds.

Implicit sessions (the Responses API's server-chosen chain: engine.serving.sessions) are
never written: a cache with a TTL of minutes is not worth tens of MB of disk, nor a slot
held across a restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from engine import (
    OPEN,
    BadSessionBlob,
    SessionKey,
    encode_session_blob_parts,
    read_session_blob_header,
)
from pantheon_platform import shutdown
from pantheon_platform.runtime import get_runtime
from sessions import records, tenancy
from sessions.spill_files import (
    REASON_SUFFIX,
    REJECTED_DIR,
    SUFFIX,
    TEMP_MARK,
    file_stem,
    model_folder,
    sessions_root,
)

log = logging.getLogger("pantheon.sessions")

# A parked session is written once its model has been idle this long after the park...
WRITE_AFTER_S = 0.5
# ...or this long after the park, busy or not.
WRITE_WITHIN_S = 3.0
_POLL_S = 0.05  # how often a busy model is looked at again


def _index(path: Path) -> int | None:
    """The conversation index in a spill file's name ("<stem>-<i>.pnkv"), else None."""
    index = path.stem.rpartition("-")[2]
    return int(index) if index.isdigit() else None


# --- files ------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes | list, *, hold_s: float = 0.0) -> None:
    """Write `data` (bytes, or a list of buffers written in turn: a blob's parts, never
    joined into a second copy) to `path` so that a crash leaves the old file or the new
    one, whole: a temp file in the same folder, flushed and fsynced, renamed over `path`,
    then the folder fsynced so the rename itself is durable. `hold_s`: a test hook's pause
    before the rename (see _test_spill_delay_s)."""
    parts = data if isinstance(data, list) else [data]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        if hold_s > 0:
            time.sleep(hold_s)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _test_spill_delay_s() -> float:
    """Test hook (PANTHEON_TEST_SPILL_DELAY_MS, default 0: no effect): how long each spill
    file waits as a complete temp file before its rename, so a test can kill the server
    inside a spill's write."""
    from django.conf import settings

    return getattr(settings, "PANTHEON_TEST_SPILL_DELAY_MS", 0) / 1000


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_temp_files(folder: Path) -> None:
    for path in folder.iterdir():
        if path.name.startswith(".") and TEMP_MARK in path.name and path.is_file():
            log.warning("removing %s, left by an interrupted session spill", path)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _spill_files(folder: Path) -> list[Path]:
    return [p for p in folder.glob("*" + SUFFIX) if p.is_file() and not p.name.startswith(".")]


def _restore_order(path: Path) -> tuple[int, str, int]:
    """Oldest first. Files are written in order, so mtime is the spill's order; the name
    breaks ties on a coarse clock and keeps one id's conversations in their order."""
    stem, _, index = path.stem.rpartition("-")
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return mtime, stem, int(index) if index.isdigit() else 0


# --- spill ------------------------------------------------------------------------------

# Held by a whole spill and by each background write of one session: a spill's clean-up
# never races a write into the same folder.
_write_lock = threading.Lock()


def spill(svc, folder: Path) -> dict[SessionKey, int]:
    """Write every conversation `svc` holds to `folder`, replacing what was there.
    Returns {session key: conversation files written}; a failed write is logged and
    skipped."""
    with _write_lock:
        return _spill_locked(svc, folder)


def _spill_locked(svc, folder: Path) -> dict[SessionKey, int]:
    held = svc.sessions.conversations(durable=True)  # implicit sessions are a cache only
    if not held and not folder.is_dir():
        return {}
    # Conversations are private: only the server's user may read them.
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    _remove_temp_files(folder)
    by_key: dict[SessionKey, list] = {}
    last_used: dict[SessionKey, float] = {}
    for key, conversation, _created, used in held:
        by_key.setdefault(key, []).append(conversation)
        last_used[key] = used
    hold_s = _test_spill_delay_s()
    written: set[str] = set()
    counts: Counter[SessionKey] = Counter()
    # Most recently used first: if fewer sessions fit at the next start, those are kept.
    for key in sorted(by_key, key=lambda k: -last_used[k]):
        for i, conv in enumerate(by_key[key]):
            path = folder / f"{file_stem(key)}-{i}{SUFFIX}"
            try:
                write_atomic(
                    path, encode_session_blob_parts(svc.snapshot(key, conv)), hold_s=hold_s
                )
            except Exception:
                log.exception("cannot spill a conversation of a session to %s", path)
                continue
            writer.wrote(path, conv)
            written.add(path.name)
            counts[key] += 1
    for path in _spill_files(folder):
        if path.name not in written:
            path.unlink(missing_ok=True)
            writer.wrote(path, None)
    _fsync_dir(folder)
    return dict(counts)


# --- background writes -------------------------------------------------------------------


class DurableWriter:
    """Writes sessions to disk off the engine thread as their turns park (see the module
    docstring). One thread for every model; `attach` a model at its load, `detach` it
    before it is unloaded."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # (id(svc), key) -> (folder, svc, noted at); insertion order is the write order
        self._pending: dict[tuple[int, SessionKey], tuple[Path, object, float]] = {}
        self._urgent = False  # flush(): write what is queued now, idle or not
        self._current: int | None = None  # id(svc) of the write in progress
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._on_disk: dict[Path, weakref.ref] = {}  # file -> the conversation it holds

    # --- any thread ---

    def attach(self, svc, folder: Path) -> None:
        """Write `svc`'s sessions to `folder` from now on, as its table reports changes."""
        sessions = svc.sessions
        svc_ref = weakref.ref(svc)  # the listener must not keep an unloaded model alive

        def changed(key: SessionKey) -> None:
            target = svc_ref()
            if target is not None:
                self.enqueue(target, folder, key)

        changed.writer = self  # detach recognises its own listener
        sessions.listener = changed
        with self._cond:
            self._stopped = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pantheon-session-writer", daemon=True
                )
                self._thread.start()

    def enqueue(self, svc, folder: Path, key: SessionKey) -> None:
        """Note that `key`'s conversations changed (cheap: the engine thread calls it)."""
        with self._cond:
            if self._stopped:
                return
            self._pending.setdefault((id(svc), key), (folder, svc, time.monotonic()))
            self._cond.notify()

    def detach(self, svc) -> None:
        """No more writes for `svc`: its listener is removed, its queued writes dropped,
        and a write of it in progress is waited for."""
        listener = getattr(svc.sessions, "listener", None)
        if getattr(listener, "writer", None) is self:
            svc.sessions.listener = None
        with self._cond:
            for item in [item for item in self._pending if item[0] == id(svc)]:
                del self._pending[item]
            while self._current == id(svc):
                self._cond.wait()

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every queued write is done; False if that took past `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            try:
                while self._pending or self._current is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._urgent = False
        return True

    def stop(self) -> None:
        """Drop what is queued, wait for the write in progress, write nothing more (the
        shutdown spill writes everything next)."""
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify_all()
            while self._current is not None:
                self._cond.wait()

    def wrote(self, path: Path, conversation) -> None:
        """`path` now holds `conversation` (None: it was deleted)."""
        if conversation is None:
            self._on_disk.pop(path, None)
        else:
            self._on_disk[path] = weakref.ref(conversation)

    # --- the writer thread ---

    def _wait_s(self, svc, noted_at: float) -> float:
        """How long the oldest note should still wait (0: write it now)."""
        if self._urgent:
            return 0.0
        age = time.monotonic() - noted_at
        if age >= WRITE_WITHIN_S:
            return 0.0
        if age < WRITE_AFTER_S:
            return WRITE_AFTER_S - age
        return _POLL_S if getattr(svc, "busy", False) else 0.0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._pending:
                        _, (_, svc, noted_at) = next(iter(self._pending.items()))
                        wait = self._wait_s(svc, noted_at)
                        del svc
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._stopped:
                    return
                (svc_id, key), (folder, svc, _) = next(iter(self._pending.items()))
                del self._pending[(svc_id, key)]
                self._current = svc_id
            try:
                with _write_lock:
                    self._write(svc, folder, key)
            except Exception:
                log.exception("cannot write a session to %s", folder)
            finally:
                del svc
                with self._cond:
                    self._current = None
                    self._cond.notify_all()

    def _write(self, svc, folder: Path, key: SessionKey) -> None:
        """Make `folder` hold exactly `key`'s conversations: write those not on disk yet,
        delete its files past them (all of them when the session is gone)."""
        conversations = svc.sessions.durable(key)  # none for an implicit session
        stem = file_stem(key)
        if conversations:
            folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, exist_ok=True)
        elif not folder.is_dir():
            return
        for i, conv in enumerate(conversations):
            path = folder / f"{stem}-{i}{SUFFIX}"
            ref = self._on_disk.get(path)
            if ref is not None and ref() is conv and path.exists():
                continue  # conversations are immutable: that file holds it already
            write_atomic(path, encode_session_blob_parts(svc.snapshot(key, conv)))
            self.wrote(path, conv)
        for path in folder.glob(f"{stem}-*{SUFFIX}"):
            index = _index(path)
            if index is None or index >= len(conversations):
                path.unlink(missing_ok=True)
                self.wrote(path, None)


writer = DurableWriter()


# --- restore ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejected:
    file: Path  # where it is now (under rejected/), or where it was if it could not move
    session_id: SessionKey | None  # None: the header could not be read
    reason: str


@dataclass
class RestoreReport:
    restored: Counter[SessionKey] = field(default_factory=Counter)  # key -> conversations
    rejected: list[Rejected] = field(default_factory=list)


def restore(svc, folder: Path, model_name: str) -> RestoreReport:
    """Install every spill file in `folder` into `svc`, oldest first; see the module
    docstring for what happens to each file."""
    report = RestoreReport()
    if not folder.is_dir():
        return report
    _remove_temp_files(folder)
    for path in sorted(_spill_files(folder), key=_restore_order):
        key = None
        try:
            blob = path.read_bytes()
            header = read_session_blob_header(blob)
            if not header["session_id"]:
                raise BadSessionBlob("the blob names no session id")
            # Back to its owner: a blob written before namespaces is the open one's.
            key = SessionKey(header["session_id"], header["namespace"] or OPEN)
            svc.restore_session(key, blob, None)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            report.rejected.append(Rejected(_reject(path, model_name, reason), key, reason))
            continue
        report.restored[key] += 1
        if path.name.rpartition("-")[0] != file_stem(key):
            path.unlink(missing_ok=True)  # an older name: written again under its stem
    return report


def _reject(path: Path, model_name: str, reason: str) -> Path:
    """Move a spill file that failed to rejected/, with the reason beside it."""
    folder = path.parent / REJECTED_DIR
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        dest, n = folder / path.name, 1
        while dest.exists():
            dest, n = folder / f"{path.stem}.{n}{SUFFIX}", n + 1
        os.replace(path, dest)
        note = f"model: {model_name}\nfile: {path.name}\nwhen: {time.ctime()}\nreason: {reason}\n"
        write_atomic(dest.with_name(dest.name + REASON_SUFFIX), note.encode())
    except OSError:
        log.exception("model %s: cannot move the rejected session file %s aside", model_name, path)
        return path
    log.warning(
        "model %s: session file %s not restored (%s); moved to %s",
        model_name,
        path.name,
        reason,
        dest,
    )
    return dest


# --- the hooks ----------------------------------------------------------------------------


def restore_on_load(name: str, svc) -> None:
    """Runtime load hook: restore the model's spilled sessions, then write its sessions
    in the background from now on (every restored one first)."""
    if not hasattr(svc, "restore_session"):  # a stand-in service
        return
    tenancy.attach(svc.sessions)  # per-key caps only while several keys could hold sessions
    folder = model_folder(sessions_root(), name)
    with _write_lock:  # no background write into the folder while it is read
        report = restore(svc, folder, name)
    writer.attach(svc, folder)
    for key in report.restored:
        writer.enqueue(svc, folder, key)
    if report.restored:
        log.info(
            "model %s: restored %d session(s) (%d conversations) from disk",
            name,
            len(report.restored),
            sum(report.restored.values()),
        )
    if report.rejected:
        by_id = {r.session_id: r.reason for r in report.rejected if r.session_id}
        # A file too broken to name its session is matched to its row by the file name.
        by_stem = {
            r.file.name.rpartition("-")[0]: r.reason for r in report.rejected if not r.session_id
        }
        records.mark_rejected(name, by_id, by_stem, keep=set(report.restored))


def spill_on_unload(name: str, svc) -> None:
    """Runtime unload hook: an unloaded or evicted model's sessions go to disk, and come
    back when the name is loaded again (the same weights; other weights reject them)."""
    if not hasattr(svc, "sessions"):  # a stand-in service
        return
    writer.detach(svc)
    infos = svc.session_info()
    counts = spill(svc, model_folder(sessions_root(), name))
    if counts:
        log.warning("model %s unloaded: spilled %d session(s) to disk", name, len(counts))
        records.record_spilled(name, [i for i in infos if i.session_id in counts])


def spill_on_exit() -> None:
    """Before-exit hook: stop the mirror and the background writer, spill every served
    model's sessions, mark their rows "spilled", and write nothing more."""
    records.stop_mirror()
    writer.stop()
    root = sessions_root()
    spilled: dict[str, set[SessionKey]] = {}
    done: set[int] = set()
    for name, svc in get_runtime().services().items():
        # One service may be served under two names (tests): spill it once.
        if id(svc) in done or not hasattr(svc, "sessions"):
            continue
        done.add(id(svc))
        folder = model_folder(root, name)
        try:
            counts = spill(svc, folder)
        except Exception:
            log.exception("model %s: cannot spill its sessions to %s", name, folder)
            continue
        if counts:
            spilled[name] = set(counts)
            log.warning(
                "model %s: spilled %d session(s) (%d conversations) to %s",
                name,
                len(counts),
                sum(counts.values()),
                folder,
            )
    records.mark_spilled(spilled)
    records.freeze()


_installed = False


def install(rt) -> None:
    """Restore at every load of `rt` (and write its sessions in the background from then
    on), spill at graceful shutdown, mirror the session tables into SessionRecord
    (pantheon_site.asgi, before the models load)."""
    global _installed
    rt.add_load_hook(restore_on_load)
    rt.add_unload_hook(spill_on_unload)
    if not _installed:
        _installed = True
        shutdown.add_before_exit(spill_on_exit)
        records.start_mirror()
