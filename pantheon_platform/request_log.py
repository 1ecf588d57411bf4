"""What a view tells the access log about its request (pantheon_site/access_log.py).

The access log is an ASGI layer outside Django: it knows the method, path, status and
bytes, but not which model served the request or which session it belonged to. Views
note those here, into a dict the layer put in the ASGI scope. Here, not in
pantheon_site, so the apps import nothing from the project package.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

SCOPE_KEY = "pantheon.log"  # the scope entry the access log reads (a dict)
ERROR_KEY = "error"  # in that dict: the type of the error the request was answered with

# The same dict, for code that holds no request (errors.api_error_from, the access guard):
# bound by the access log around the request, so its tasks and threads see it.
_current: ContextVar[dict | None] = ContextVar("pantheon_request_log", default=None)


def bind(fields: dict):
    """Make `fields` the current request's dict (the access log); returns the token to
    reset it with."""
    return _current.set(fields)


def unbind(token) -> None:
    _current.reset(token)


def note_error(type_: str) -> None:
    """The error type the current request is answered with (the reason a 429 is counted
    under in the metrics). Nothing outside a request."""
    fields = _current.get()
    if fields is not None:
        fields[ERROR_KEY] = type_


def session_hash(session_id: str) -> str:
    """What the log shows of a session id: 12 hex chars of its sha256 (a session id may
    be a user's identifier; the hash still ties one session's lines together)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def note(
    request,
    *,
    model: str | None = None,
    session_id: str | None = None,
    config: dict[str, list] | None = None,
) -> None:
    """Record the served model and the session of `request` (a Django or DRF request) for
    its access-log line. The session id is kept hashed only. `config`: the settings a
    PATCH /admin/config changed, {name: [old, new]} (the audit; values are the settings'
    checked values, never free text). Without an ASGI scope (a test client, WSGI) there
    is no line to write: nothing happens."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return
    # The access log put this dict in the scope before routing; routers copy the scope
    # (Channels' URLRouter does) but not the dict, so it is the one the log will read.
    fields = scope.setdefault(SCOPE_KEY, {})
    if model:
        fields["model"] = model
    if session_id:
        fields["session"] = session_hash(session_id)
    if config:
        fields["config"] = config
