"""The SessionRecord table mirrors the engines' session tables for the console.

The engine is the truth. A daemon thread (`start_mirror`) snapshots every served
model's `session_info()` once a second and reconciles the table: new sessions get a row,
changed ones are updated, rows of sessions that are gone are deleted. `sync_now()` does
the same at once (the console's change list calls it, and tests).

Two states outlive the engine table: "spilled" rows (written to disk at the last graceful
shutdown) wait for their model to load; once it has (its spill files are restored before
it becomes routable) the restored ones turn live and the rest go. "rejected" rows (a spill
file that failed validation) stay until an operator releases them.

A row is (model, namespace, session id): the namespace is the API key that owns the
session (engine.serving.session_key.SessionKey), so the same id under two keys is
two rows.

Database errors are logged and never stop the thread or the server.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

from django.db import connections, transaction

from engine import SessionKey
from pantheon_platform.runtime import get_runtime
from sessions.models import SessionRecord
from sessions.spill_files import file_stem

log = logging.getLogger("pantheon.sessions")

State = SessionRecord.State
ENGINE_STATES = (State.LIVE, State.BUSY, State.WATCHED)
MIRROR_INTERVAL_S = 1.0

_sync_lock = threading.Lock()  # one reconcile at a time (the thread, the console)
_frozen = threading.Event()  # set once the shutdown spill marked its rows: write no more
_mirror: _Mirror | None = None


def _when(unix: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(unix, tz=dt.UTC)


def _state(info) -> str:
    if info.in_flight:
        return State.BUSY
    if info.watches:
        return State.WATCHED
    return State.LIVE


def _fields(info) -> dict:
    return {
        "conversations": info.conversations,
        "tokens": info.tokens,
        "total_tokens": info.total_tokens,
        "kv_bytes": info.kv_bytes,
        "created": _when(info.created),
        "last_used": _when(info.last_used),
        "state": _state(info),
        "detail": "",
    }


def engine_snapshot() -> dict[str, list]:
    """{served name: [SessionInfo]} for every served model that keeps sessions."""
    found = {}
    for name, svc in get_runtime().services().items():
        info = getattr(svc, "session_info", None)
        if info is None:  # a stand-in service (routing tests)
            continue
        try:
            found[name] = info()
        except Exception:
            log.exception("cannot read the sessions of model %s", name)
    return found


def sync_now() -> bool:
    """Reconcile the table with the engines now. False when it could not (logged)."""
    if _frozen.is_set():
        return False
    with _sync_lock:
        try:
            _reconcile(engine_snapshot())
        except Exception:
            log.exception("cannot update the session records")
            return False
    return True


def _reconcile(live: dict[str, list]) -> None:
    with transaction.atomic():
        rows = {(r.model_name, r.namespace, r.session_id): r for r in SessionRecord.objects.all()}
        for name, infos in live.items():
            for info in infos:
                fields = _fields(info)
                row = rows.pop((name, info.namespace, str(info.session_id)), None)
                if row is None:
                    SessionRecord.objects.create(
                        model_name=name,
                        namespace=info.namespace,
                        session_id=str(info.session_id),
                        **fields,
                    )
                elif any(getattr(row, key) != value for key, value in fields.items()):
                    for key, value in fields.items():
                        setattr(row, key, value)
                    row.save()
        gone = [
            row.pk
            for (name, _, _), row in rows.items()
            # A loaded model's table is complete (its spill files were restored before it
            # became routable); a model not loaded keeps only what is still on disk.
            if (name in live and row.state != State.REJECTED)
            or (name not in live and row.state in ENGINE_STATES)
        ]
        if gone:
            SessionRecord.objects.filter(pk__in=gone).delete()


# --- persistence events (sessions.persistence) --------------------------------------------


def _matching(model_name: str, keys) -> list[int]:
    """The pks of `model_name`'s rows for these session keys."""
    wanted = {(k.namespace, str(k)) for k in map(SessionKey.of, keys)}
    rows = SessionRecord.objects.filter(
        model_name=model_name, session_id__in={sid for _, sid in wanted}
    )
    return [r.pk for r in rows if (r.namespace, r.session_id) in wanted]


def mark_spilled(spilled: dict[str, set[str]]) -> None:
    """The shutdown spill wrote these {model: session keys}: record them as "spilled"."""
    with _sync_lock:
        try:
            # One transaction: a kill part-way leaves the rows as they were, never
            # reconciled without the spilled states.
            with transaction.atomic():
                _reconcile(engine_snapshot())
                for name, keys in spilled.items():
                    SessionRecord.objects.filter(pk__in=_matching(name, keys)).update(
                        state=State.SPILLED
                    )
        except Exception:
            log.exception("cannot record the spilled sessions")


def record_spilled(model_name: str, infos: list) -> None:
    """An unloaded model's sessions went to disk: their rows (created if the mirror had
    not seen them yet) say "spilled" until the model loads again."""
    if _frozen.is_set():
        return
    with _sync_lock:
        try:
            with transaction.atomic():
                for info in infos:
                    SessionRecord.objects.update_or_create(
                        model_name=model_name,
                        namespace=info.namespace,
                        session_id=str(info.session_id),
                        defaults={**_fields(info), "state": State.SPILLED},
                    )
        except Exception:
            log.exception("cannot record the spilled sessions of model %s", model_name)


def freeze() -> None:
    """Write nothing more (the process exits after the shutdown spill): a console page
    loaded in the last moments must not turn the spilled rows back into live ones."""
    _frozen.set()


def thaw() -> None:
    """Undo freeze() (tests that run the shutdown spill in-process)."""
    _frozen.clear()


def mark_rejected(
    model_name: str, by_id: dict[str, str], by_stem: dict[str, str], keep: set[str]
) -> None:
    """A start refused spill files of `model_name`: mark their "spilled" rows "rejected"
    with the reason. `by_id` {session key: why} comes from files whose header was
    readable, `by_stem` {file stem: why} from the others (a row matches by the hashed key
    its files are named after). Keys in `keep` had another conversation restored: live."""
    with _sync_lock:
        try:
            with transaction.atomic():
                spilled = SessionRecord.objects.filter(model_name=model_name, state=State.SPILLED)
                for row in spilled:
                    key = SessionKey(row.session_id, row.namespace)
                    if key in keep:
                        continue
                    why = by_id.get(key) or by_stem.get(file_stem(key))
                    if why:
                        row.state = State.REJECTED
                        row.detail = why
                        row.save(update_fields=["state", "detail", "updated"])
        except Exception:
            log.exception("cannot record the rejected sessions of model %s", model_name)


def forget(model_name: str, session_id: str) -> None:
    """Delete one row (a released session that only the table still named); a plain str
    id is in the open namespace."""
    key = SessionKey.of(session_id)
    SessionRecord.objects.filter(
        model_name=model_name, namespace=key.namespace, session_id=str(key)
    ).delete()


# --- the mirror thread --------------------------------------------------------------------


class _Mirror:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pantheon-sessions", daemon=True)
        self._last_failed = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if _frozen.is_set():
                    return
                with _sync_lock:
                    try:
                        _reconcile(engine_snapshot())
                    except Exception:
                        # Once per outage, not once a second (e.g. migrations not applied).
                        if not self._last_failed:
                            log.exception("cannot update the session records; retrying")
                        self._last_failed = True
                        connections.close_all()  # a broken connection is reopened next time
                    else:
                        if self._last_failed:
                            log.info("session records are updated again")
                        self._last_failed = False
        finally:
            connections.close_all()


def start_mirror(interval: float = MIRROR_INTERVAL_S) -> None:
    """Start the mirror thread (idempotent)."""
    global _mirror
    if _mirror is None:
        _mirror = _Mirror(interval)
        _mirror.start()


def stop_mirror() -> None:
    """Stop the mirror thread and wait for its current reconcile to end."""
    global _mirror
    mirror, _mirror = _mirror, None
    if mirror is not None:
        mirror.stop()
