"""Whose sessions a request reaches: the namespace of the caller's API key.

The access guard (access/guard.py) puts the authenticated key's namespace in the ASGI
scope ("key:<console key id>", "env:client", "env:admin"; "open" when the request needed
no key). Every session route and the chat route's session id go through `session_key`,
the one place a client's session id becomes an engine SessionKey: the same id sent with
two keys is two sessions, and no request reaches another key's. (How many keys could
hold sessions, for the per-key caps, is sessions/tenancy.py.)
"""

from __future__ import annotations

from engine import OPEN, SessionKey
from pantheon_platform.strict_json import IDENTIFIER_MAX

# A session id, wherever it is sent (the chat routes' session_id / prompt_cache_key, the
# X-Session-Id header, the session routes, /session/watch).
SESSION_ID_MAX = IDENTIFIER_MAX

SCOPE_NAMESPACE = "pantheon.namespace"  # access.guard.NAMESPACE_KEY


def namespace(request_or_scope) -> str:
    """The caller's namespace from a Django request (its ASGI scope) or a scope dict.
    Without one (no guard in front: a test client, WSGI) a request is in the open
    namespace, as on a server with no key."""
    scope = request_or_scope if isinstance(request_or_scope, dict) else None
    if scope is None:
        scope = getattr(request_or_scope, "scope", None)
    if not isinstance(scope, dict):
        return OPEN
    value = scope.get(SCOPE_NAMESPACE)
    return value if isinstance(value, str) and value else OPEN


SCOPE_OPERATOR = "pantheon.operator"  # access.guard.OPERATOR_KEY


def is_operator(request_or_scope) -> bool:
    """Whether the caller may see the server's internals (a model file's absolute path):
    an admin-scoped key, or any caller of a server with no key. Without a guard in front
    (a test client, WSGI) as on a server with no key."""
    scope = request_or_scope if isinstance(request_or_scope, dict) else None
    if scope is None:
        scope = getattr(request_or_scope, "scope", None)
    if not isinstance(scope, dict):
        return True
    return scope.get(SCOPE_OPERATOR, True) is not False


# The priority class a request runs in (engine.serving.scheduler): interactive unless
# the batch runner put "batch" in its scope (wire/batches/dispatch.py) or the request
# asked for it (`"priority": "batch"`, chat completions).
SCOPE_PRIORITY = "pantheon.priority"
INTERACTIVE, BATCH = "interactive", "batch"


def priority(request_or_scope) -> str:
    """The request's priority class: "interactive" (the default) or "batch"."""
    scope = request_or_scope if isinstance(request_or_scope, dict) else None
    if scope is None:
        scope = getattr(request_or_scope, "scope", None)
    if isinstance(scope, dict) and scope.get(SCOPE_PRIORITY) == BATCH:
        return BATCH
    return INTERACTIVE


def session_key(request_or_scope, session_id: str | None) -> SessionKey | None:
    """The caller's session `session_id` (None stays None)."""
    if session_id is None:
        return None
    return SessionKey(session_id, namespace(request_or_scope))
