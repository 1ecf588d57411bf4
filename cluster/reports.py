"""What a serve instance sends to /registry/register and /registry/heartbeat, checked by the
router before it reaches Redis (a malformed report is a 400, never a 500):

{"id": "127.0.0.1:8001", "url": "http://127.0.0.1:8001", "started_at": 1720000000.0,
 "stopping": false, "restore_max_bytes": 67108864,
 "models": [{"id": "smollm2-135m-instruct", "context_window": 8192, "max_concurrent": 4,
             "free_slots": 3, "queue_depth": 0, "queue_capacity": 32, "sessions": 1,
             "weights_version": "..."}],
 "aliases": {"alias": "served name"},
 "sessions": [{"session_id": "s1", "namespace": "open", "model": "...", "tokens": 42}]}

`restore_max_bytes` is the instance's /session/restore body limit (it grows with its
models' KV size): the router answers 413 past the largest one any instance reports, so a
blob an instance takes is never refused on the way. `context_window` may be left out (not known): the router's /v1/models then omits the
model's window (the contract). `sessions` lists the parked sessions a drain moves.
"""

from __future__ import annotations

import math

from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX

MAX_MODELS = 256
MAX_SESSIONS = 100_000
MODEL_COUNTS = ("max_concurrent", "free_slots", "queue_depth", "queue_capacity", "sessions")


def parse_report(body: dict) -> dict:
    """The report with only the fields above, each checked; raises the 400 ApiError."""
    url = _string(body, "url", 2048)
    if not url.startswith(("http://", "https://")):
        raise invalid_request("url: expected an http:// or https:// URL the router can reach")
    started_at = body.get("started_at")
    if not _number(started_at):
        raise invalid_request("started_at: expected a number (the process's start time)")
    models = body.get("models")
    if not isinstance(models, list) or len(models) > MAX_MODELS:
        raise invalid_request(f"models: expected an array of at most {MAX_MODELS} objects")
    aliases = body.get("aliases") or {}
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
    ):
        raise invalid_request("aliases: expected an object of alias -> served name strings")
    sessions = body.get("sessions") or []
    if not isinstance(sessions, list) or len(sessions) > MAX_SESSIONS:
        raise invalid_request(f"sessions: expected an array of at most {MAX_SESSIONS} objects")
    return {
        "id": _string(body, "id", IDENTIFIER_MAX),
        "url": url.rstrip("/"),
        "started_at": float(started_at),
        "stopping": body.get("stopping") is True,
        "models": [_model(m, i) for i, m in enumerate(models)],
        "aliases": aliases,
        "sessions": [_session(s, i) for i, s in enumerate(sessions)],
        "restore_max_bytes": _byte_count(body.get("restore_max_bytes", 0), "restore_max_bytes"),
    }


def _model(m: object, i: int) -> dict:
    if not isinstance(m, dict):
        raise invalid_request(f"models[{i}]: expected an object")
    row = {"id": _string(m, "id", IDENTIFIER_MAX, f"models[{i}].")}
    for name in MODEL_COUNTS:
        row[name] = _count(m.get(name, 0), f"models[{i}].{name}")
    row["weights_version"] = m.get("weights_version") or ""
    if not isinstance(row["weights_version"], str):
        raise invalid_request(f"models[{i}].weights_version: expected a string")
    window = m.get("context_window")
    if window is not None:  # absent or null: not reported
        row["context_window"] = _count(window, f"models[{i}].context_window")
        if not row["context_window"]:
            raise invalid_request(f"models[{i}].context_window: leave it out when unknown, not 0")
    return row


def _session(s: object, i: int) -> dict:
    if not isinstance(s, dict):
        raise invalid_request(f"sessions[{i}]: expected an object")
    where = f"sessions[{i}]."
    return {
        "session_id": _string(s, "session_id", IDENTIFIER_MAX, where),
        "namespace": _string(s, "namespace", IDENTIFIER_MAX, where),
        "model": _string(s, "model", IDENTIFIER_MAX, where),
        "tokens": _count(s.get("tokens", 0), where + "tokens"),
    }


def _string(obj: dict, name: str, limit: int, where: str = "") -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise invalid_request(f"{where}{name}: expected a non-empty string of at most {limit}")
    return value


def _count(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise invalid_request(f"{where}: expected an integer >= 0")
    return value


def _byte_count(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise invalid_request(f"{where}: expected an integer number of bytes >= 0")
    return value


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
