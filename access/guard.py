"""AccessGuard: the ASGI layer that decides whether an HTTP request reaches the app.

In this order (pantheon_site.stack puts it inside the access log, outside the body limit):

1. Host: on a connection to a loopback address, Host must be a loopback name (localhost,
   *.localhost, 127.x.x.x, [::1], any port), else 403 forbidden_host. A page on another
   site that rebinds its DNS name to 127.0.0.1 still sends its own name as Host.
2. Origin: a state-changing request (not GET/HEAD/OPTIONS) that sends Origin must come
   from the request's own Host or from PANTHEON_ALLOWED_ORIGINS ("*": any), else 403
   forbidden_origin.
3. Content-Type: a POST/PUT/PATCH/DELETE to an operator or session route that declares a
   non-JSON Content-Type is 415 unsupported_media_type: a cross-site <form> or text/plain
   post cannot reach them. An absent Content-Type passes (curl, SDKs).
4. Key: when any key is configured (access.keys), a route that needs a scope
   (pantheon_platform.routes.scope_for) needs a key, as `Authorization: Bearer <key>` or
   `x-api-key: <key>`: 401 invalid_api_key without a valid one, 403 insufficient_scope
   when the key lacks the route's scope. OPTIONS (the CORS preflight) and the open routes
   (GET /, /openapi.json, the console with its own login and CSRF) need none.
5. Quota: a key with a concurrency limit (its own max_concurrent, else
   PANTHEON_KEY_MAX_CONCURRENT) gets 429 key_concurrency_exceeded with Retry-After past
   it. A request counts until the app returns, so a stream counts until it ends.

Only `http` scopes are checked; the rest (lifespan) pass through. The authenticated key's
label (never the key) is put in scope["pantheon.key"] in place, for the access log, and
its session namespace (namespace_of) in scope["pantheon.namespace"]: each key's sessions
are its own (pantheon_platform/tenancy.py); whether it is an operator (is_operator) in
scope["pantheon.operator"].
"""

from __future__ import annotations

import ipaddress
import logging
from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from access import forwarded, keys
from access.forwarded import NAMESPACE_HEADER, PROOF_HEADER
from engine import WORK_OWNER
from pantheon_platform import routes, tenancy

log = logging.getLogger("pantheon.http")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SCOPE_KEY = "pantheon.key"  # the authenticated key's label, for the access log
NAMESPACE_KEY = "pantheon.namespace"  # whose sessions it reaches (pantheon_platform/tenancy.py)
OPERATOR_KEY = "pantheon.operator"  # may see server internals (pantheon_platform/tenancy.py)
KEY_HOWTO = (
    "send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>' (PANTHEON_API_KEY, "
    "PANTHEON_ADMIN_API_KEY, or a key made in the console at /console/)"
)


class Refusal(Exception):
    def __init__(self, status: int, type_: str, message: str, headers=()):
        super().__init__(message)
        self.status, self.type, self.message, self.headers = status, type_, message, headers


class AccessGuard:
    def __init__(self, app):
        self.app = app
        self.in_flight: dict[str, int] = {}  # per key identity (access.keys.Principal)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            principal = await admit(scope)
        except Refusal as refusal:
            return await refuse(send, refusal, scope.get("path", ""))
        scope[NAMESPACE_KEY] = namespace_for(scope, principal)  # in place, before routing
        scope[OPERATOR_KEY] = is_operator(scope, principal)
        # Whom this request's work is for: the unit of fairness of the prepare pool and
        # the engine's side jobs (engine.WORK_OWNER). Without keys, each client address.
        owner = scope[NAMESPACE_KEY]
        if principal is None:
            owner = f"{owner}@{(scope.get('client') or ('', 0))[0]}"
        WORK_OWNER.set(owner)  # this request's task only (the context is per task)
        if principal is None:
            return await self.app(scope, receive, send)
        scope[SCOPE_KEY] = principal.label  # in place: the outer access log reads it
        if principal.priority == tenancy.BATCH:  # a batch key: every request in that class
            scope[tenancy.SCOPE_PRIORITY] = tenancy.BATCH
        limit = keys.max_concurrent_for(principal)
        identity = principal.identity
        if limit and self.in_flight.get(identity, 0) >= limit:
            return await refuse(
                send,
                Refusal(
                    429,
                    "key_concurrency_exceeded",
                    f"this key ({principal.label}) already has {limit} request(s) in flight, "
                    "its limit (the key's max_concurrent, else PANTHEON_KEY_MAX_CONCURRENT): "
                    "retry when one has finished",
                    [(b"retry-after", b"1")],
                ),
                scope.get("path", ""),
            )
        self.in_flight[identity] = self.in_flight.get(identity, 0) + 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight[identity] -= 1
            if not self.in_flight[identity]:
                del self.in_flight[identity]


NEEDS_DATABASE = object()  # check_now's verdict when only a console-key lookup can decide


def check_now(scope) -> keys.Principal | None | object:
    """Every check that needs no database, in the guard's order: Host, Origin,
    Content-Type, then the key when an env key decides it. Returns the Principal, None
    (no key needed) or NEEDS_DATABASE; raises Refusal. The Daphne hook
    (pantheon_site/daphne_hooks.py) calls it once the headers are in, before the body is
    read; `admit` calls it for every request."""
    check_host(scope)
    check_origin(scope)
    check_content_type(scope)
    needed = routes.scope_for(scope["path"])
    if scope["method"] == "OPTIONS" or needed == routes.OPEN:
        return None
    if not keys.env_principals():
        exist = keys.cached_console_keys_exist()
        if exist is None:
            return NEEDS_DATABASE
        if not exist:
            return None  # no key configured: open, as the contract says
    presented = presented_keys(scope)
    principal = keys.match_env(presented)
    if principal is None and any(k.startswith(keys.KEY_PREFIX) for k in presented):
        return NEEDS_DATABASE  # only the console key table can say
    return _authorized(scope, needed, principal, presented)


async def admit(scope) -> keys.Principal | None:
    """check_now, then the console-key lookup when it is needed: the Principal, or None
    when the request needs no key. Raises Refusal (a 503 when the key table cannot be
    read: fail closed)."""
    try:
        verdict = check_now(scope)
        if verdict is not NEEDS_DATABASE:
            return verdict
        if not keys.env_principals() and not await _console_keys_exist():
            return None  # no key configured: open, as the contract says
        presented = presented_keys(scope)
        principal = keys.match_env(presented)
        if principal is None and presented:
            principal = await _lookup_console(presented)
        return _authorized(scope, routes.scope_for(scope["path"]), principal, presented)
    except DatabaseError:
        # Fail closed: the console keys cannot be read (e.g. `migrate` was not run).
        log.exception("API keys: the key table cannot be read")
        raise Refusal(
            503,
            "key_store_unavailable",
            "the server cannot read its API keys from the database; the operator "
            "should check the database and run `manage.py migrate`",
        ) from None


def _authorized(scope, needed: str, principal, presented: list[str]) -> keys.Principal:
    if principal is None:
        message = (
            f"the API key is not valid (unknown or revoked); {KEY_HOWTO}"
            if presented
            else f"this route needs an API key: {KEY_HOWTO}"
        )
        raise Refusal(401, "invalid_api_key", message, [(b"www-authenticate", b"Bearer")])
    if needed not in principal.scopes:
        scope[SCOPE_KEY] = principal.label
        raise Refusal(
            403,
            "insufficient_scope",
            f"this key ({principal.label}) lacks the '{needed}' scope that "
            f"{scope['path']} needs: use PANTHEON_ADMIN_API_KEY or a console key "
            f"that has '{needed}'",
        )
    return principal


def namespace_of(principal: keys.Principal | None) -> str:
    """The session namespace of a caller: "key:<console key id>", "env:client",
    "env:admin", or "open" when the request needed no key (a server with none)."""
    if principal is None:
        return "open"
    kind, _, rest = principal.identity.partition(":")
    return f"key:{rest}" if kind == "console" else principal.identity


def namespace_for(scope, principal: keys.Principal | None) -> str:
    """The caller's namespace, or the one a router names in X-Pantheon-Namespace when it
    forwards a client's request (cluster/dispatch.py): honoured only with the router's
    proof made with the cluster's shared secret (access/forwarded.py), never from a client,
    whatever its key."""
    named = forwarded.forwarded_namespace(
        {
            NAMESPACE_HEADER: header(scope, NAMESPACE_HEADER),
            PROOF_HEADER: header(scope, PROOF_HEADER),
        }
    )
    return named if named is not None else namespace_of(principal)


def is_operator(scope, principal: keys.Principal | None) -> bool:
    """Whether the caller may see the server's internals (a model's file path): an
    admin-scoped key, or anyone on a server with no key; never a client a router forwards
    (X-Pantheon-Namespace), whose own key is not known here."""
    if header(scope, NAMESPACE_HEADER):
        return False
    return principal is None or routes.ADMIN in principal.scopes


# Not thread-sensitive: outside Django's per-request context, thread-sensitive calls share
# one thread, and a key lookup must not queue behind a long synchronous call there.
_console_keys_exist = database_sync_to_async(keys.console_keys_exist, thread_sensitive=False)
_lookup_console = database_sync_to_async(keys.lookup_console, thread_sensitive=False)


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


def presented_keys(scope) -> list[str]:
    found = []
    for key, value in scope.get("headers", ()):
        name = key.lower()
        text = value.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                found.append(token.strip())
        elif name == b"x-api-key" and text:
            found.append(text)
    return found


# --- Host ----------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    host = host.strip().lower().strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host_port(value: str) -> tuple[str, str]:
    """'[::1]:8000' -> ('::1', '8000'); 'localhost' -> ('localhost', '')."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest.removeprefix(":")
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        return host, port
    return value, ""


def check_host(scope) -> None:
    server = scope.get("server")
    if not server or not isinstance(server[0], str) or not is_loopback(server[0]):
        return  # not a loopback connection (or a unix socket): nothing to rebind to
    host = header(scope, b"host")
    if host is None:
        return  # HTTP/1.0 without Host: not a browser
    if is_loopback(split_host_port(host)[0]):
        return
    raise Refusal(
        403,
        "forbidden_host",
        f"Host '{host}' is not a loopback name, and this connection came in on a loopback "
        "address: only Host localhost, *.localhost, 127.x.x.x or [::1] is answered here "
        "(a DNS-rebinding defence). Use http://127.0.0.1:<port>/, or bind the server to "
        "a non-loopback address (with an API key) to serve other names.",
    )


# --- Origin --------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _netloc(host_port: str, scheme: str) -> tuple[str, str]:
    host, port = split_host_port(host_port)
    return host, port or _DEFAULT_PORTS.get(scheme, "")


def _normal_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


def check_origin(scope) -> None:
    if scope["method"] in SAFE_METHODS:
        return
    origin = header(scope, b"origin")
    if origin is None:
        return  # not a browser (browsers send Origin on every cross-site POST)
    allowed = settings.PANTHEON_ALLOWED_ORIGINS
    if "*" in allowed or _normal_origin(origin) in {_normal_origin(o) for o in allowed}:
        return
    parts = urlsplit(origin.strip())
    host = header(scope, b"host")
    # A Host without a port means the default port of the scheme the browser used, which
    # for a same-origin request is the Origin's (also behind a TLS-terminating proxy).
    if parts.scheme and parts.netloc and host:
        if _netloc(parts.netloc, parts.scheme) == _netloc(host, parts.scheme.lower()):
            return
    raise Refusal(
        403,
        "forbidden_origin",
        f"Origin '{origin}' may not make state-changing requests here: it is not this "
        f"server's own origin (Host '{host or ''}'). To let a web app call this server, "
        "add its origin to PANTHEON_ALLOWED_ORIGINS (comma-separated; '*' allows any).",
    )


# --- Content-Type --------------------------------------------------------------------


def is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def check_content_type(scope) -> None:
    if scope["method"] not in BODY_METHODS or not routes.is_management(scope["path"]):
        return
    content_type = header(scope, b"content-type")
    if content_type is None or is_json_media_type(content_type):
        return
    raise Refusal(
        415,
        "unsupported_media_type",
        f"Content-Type '{content_type}' is not accepted on {scope['path']}: send a JSON "
        "body with 'Content-Type: application/json' (or no Content-Type). Operator and "
        "session routes refuse form and text bodies, so a cross-site form cannot post "
        "to them.",
    )


# --- the refusal ---------------------------------------------------------------------


async def refuse(send, refusal: Refusal, path: str = "") -> None:
    """The error shape of the route's wire format (the contract's, Anthropic's on
    /v1/messages, Ollama's on /api/), with its CORS and Connection headers."""
    from pantheon_platform.errors import send_asgi_error
    from pantheon_platform.request_log import note_error

    note_error(refusal.type)  # a 429's reason in the metrics
    await send_asgi_error(
        send, refusal.status, refusal.message, refusal.type, refusal.headers, path=path
    )
