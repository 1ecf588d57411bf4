"""Sessions survive a graceful restart: spilled to disk at shutdown, restored at load.

Layout: DATA_DIR/sessions/<model folder>/<sha256(session id)[:24]>-<i>.pnkv, one file
per conversation (i counts an id's conversations, least recently used first), each a
session blob (inference.engine.serving.session_blob) whose header names the session id: the
file name never reveals it. The model folder is the served name made filesystem-safe
plus a short hash of the exact name, so two names never share a folder.

- Shutdown (`spill_on_exit`, an inference.shutdown before-exit hook, after the drain):
  every conversation of every served model is written atomically (temp file in the same
  folder, fsync, rename, fsync of the folder); then the files of that model that the new
  spill did not write are deleted. Sessions are written most recently used first.
- Unload or eviction (`spill_on_unload`, a runtime unload hook, after the model's
  generations drained): the same spill for that one model, so that loading the name again
  (an operator, or the next LRU swap) brings its sessions back.
- Load (`restore_on_load`, a runtime load hook: it runs before the model is routable):
  each file, oldest first, is checked and installed with `svc.restore_session`, which
  validates everything before it touches the session table, so a file is restored whole
  or not at all. A restored file is deleted (the session is in memory now; the next
  graceful stop writes it again). A file that fails (unreadable, corrupt, truncated,
  other weights, no free session slot...) is moved to rejected/ with a .reason.txt next
  to it and a warning in the log. Stray temp files of an interrupted write are removed.

A hard kill between a start and the next graceful stop loses the restored sessions:
they are clients' caches, and a client replays its conversation when a session is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from inference import runtime as registry
from inference import shutdown
from inference.engine.serving.session_blob import SessionSnapshot, encode, read_header
from inference.engine.types import BadSessionBlob
from sessions import records

log = logging.getLogger("pantheon.sessions")

SUFFIX = ".pnkv"
TEMP_MARK = ".tmp-"  # in the name of a file being written: ".<final name>.tmp-<random>"
REJECTED_DIR = "rejected"
REASON_SUFFIX = ".reason.txt"


def sessions_root() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / "sessions"


def model_folder(root: Path, model_name: str) -> Path:
    """The spill folder of a served name: readable, and unique per exact name."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name).strip("._")[:64] or "model"
    digest = hashlib.sha256(model_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return root / f"{safe}-{digest}"


def file_stem(session_id: str) -> str:
    """What a session's spill files are named after (the id itself may be private)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]


# --- files ------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, *, hold_s: float = 0.0) -> None:
    """Write `data` to `path` so that a crash leaves the old file or the new one, whole:
    a temp file in the same folder, flushed and fsynced, renamed over `path`, then the
    folder fsynced so the rename itself is durable. `hold_s`: a test hook's pause before
    the rename (see _test_spill_delay_s)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARK}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def spill(svc, folder: Path) -> dict[str, int]:
    """Write every conversation `svc` holds to `folder`, replacing what was there.
    Returns {session id: conversation files written}; a failed write is logged and
    skipped."""
    held = svc.sessions.conversations()
    if not held and not folder.is_dir():
        return {}
    # Conversations are private: only the server's user may read them.
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    _remove_temp_files(folder)
    by_id: dict[str, list] = {}
    last_used: dict[str, float] = {}
    for session_id, conversation, _created, used in held:
        by_id.setdefault(session_id, []).append(conversation)
        last_used[session_id] = used
    layout = svc.kv_layout
    hold_s = _test_spill_delay_s()
    written: set[str] = set()
    counts: Counter[str] = Counter()
    # Most recently used first: if fewer sessions fit at the next start, those are kept.
    for session_id in sorted(by_id, key=lambda sid: -last_used[sid]):
        for i, conv in enumerate(by_id[session_id]):
            path = folder / f"{file_stem(session_id)}-{i}{SUFFIX}"
            try:
                snapshot = SessionSnapshot(
                    layout, conv.tokens, conv.k, conv.v, session_id, created=time.time()
                )
                write_atomic(path, encode(snapshot), hold_s=hold_s)
            except Exception:
                log.exception("cannot spill a conversation of a session to %s", path)
                continue
            written.add(path.name)
            counts[session_id] += 1
    for path in _spill_files(folder):
        if path.name not in written:
            path.unlink(missing_ok=True)
    _fsync_dir(folder)
    return dict(counts)


# --- restore ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejected:
    file: Path  # where it is now (under rejected/), or where it was if it could not move
    session_id: str | None  # None: the header could not be read
    reason: str


@dataclass
class RestoreReport:
    restored: Counter[str] = field(default_factory=Counter)  # session id -> conversations
    rejected: list[Rejected] = field(default_factory=list)


def restore(svc, folder: Path, model_name: str) -> RestoreReport:
    """Install every spill file in `folder` into `svc`, oldest first; see the module
    docstring for what happens to each file."""
    report = RestoreReport()
    if not folder.is_dir():
        return report
    _remove_temp_files(folder)
    for path in sorted(_spill_files(folder), key=_restore_order):
        session_id = None
        try:
            blob = path.read_bytes()
            session_id = read_header(blob)["session_id"]
            if not session_id:
                raise BadSessionBlob("the blob names no session id")
            svc.restore_session(session_id, blob, None)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            report.rejected.append(Rejected(_reject(path, model_name, reason), session_id, reason))
            continue
        report.restored[session_id] += 1
        path.unlink(missing_ok=True)
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
    """Runtime load hook: restore the model's spilled sessions."""
    if not hasattr(svc, "restore_session"):  # a stand-in service
        return
    report = restore(svc, model_folder(sessions_root(), name), name)
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
    infos = svc.session_info()
    counts = spill(svc, model_folder(sessions_root(), name))
    if counts:
        log.warning("model %s unloaded: spilled %d session(s) to disk", name, len(counts))
        records.record_spilled(name, [i for i in infos if i.session_id in counts])


def spill_on_exit() -> None:
    """Before-exit hook: stop the mirror, spill every served model's sessions, mark their
    rows "spilled", and write nothing more."""
    records.stop_mirror()
    root = sessions_root()
    spilled: dict[str, set[str]] = {}
    done: set[int] = set()
    for name, svc in registry.runtime.services().items():
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
    """Restore at every load of `rt`, spill at graceful shutdown, mirror the session
    tables into SessionRecord (pantheon_site.asgi, before the models load)."""
    global _installed
    rt.add_load_hook(restore_on_load)
    rt.add_unload_hook(spill_on_unload)
    if not _installed:
        _installed = True
        shutdown.add_before_exit(spill_on_exit)
        records.start_mirror()
