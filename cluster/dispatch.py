"""The router's client routes: each request forwarded to one serve instance and its answer
passed back as it comes, chunk by chunk (an ASGI app, not a Django view: nothing is
buffered and nothing per chunk runs but one `send`).

The caller's key was checked by the access guard in front of this app (the router's own
keys and scopes); the instance is called with the router's key (PANTHEON_ROUTER_KEY) and
the caller's session namespace in X-Pantheon-Namespace (made unique to the cluster and
proved with its shared secret: access/forwarded.py), so each key's sessions and stored
responses stay its own on the instances too, apart from the instances' own keys. Where a
request goes: cluster/placement.py. A session id's instance is recorded when a turn with it
succeeds there; a stored response's (/v1/responses) when it is made.

An instance that fails before its status line (refused connection, or died holding the
request) is followed by another replica; one that fails after it ends the stream in its
format's error event (cluster/stream_errors.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import defaultdict

import httpx
import redis
from django.conf import settings

from access import forwarded
from cluster import placement
from cluster.registry import Instance, get_registry, registry_unavailable
from cluster.stream_errors import INSTANCE_FAILED, StreamTail
from cluster.target import Target, json_object, without_session
from pantheon_platform.errors import ERROR_TYPE_HEADER, ApiError, send_asgi_error

log = logging.getLogger("pantheon.cluster")

INSTANCE_UNAVAILABLE = "instance_unavailable"

# Every client route a serve instance has (wire/urls.py, wire/ollama/urls.py,
# wire/responses/urls.py, sessions/urls.py and /session/watch); tests/cluster checks the
# list against the instance's URL table. The router answers /, /health and /v1/models
# itself; the instances' operator routes (/admin/...) are reached on each instance.
FORWARDED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/tokenize",
        "/detokenize",
        "/session/restore",
        "/session/release",
        "/session/estimate",
        "/session/watch",
        # llama-server's routes (wire/llamacpp)
        "/props",
        "/slots",
        "/completion",
        "/infill",
    }
)
FORWARDED_PREFIXES = ("/v1/responses/", "/api/")
NAMESPACE_HEADER = forwarded.NAMESPACE_HEADER.decode()
PROOF_HEADER = forwarded.PROOF_HEADER.decode()

# Not passed on: the caller's credentials and browser headers (checked here), hop-by-hop.
DROPPED_REQUEST_HEADERS = frozenset(
    {
        "host",
        "authorization",
        "x-api-key",
        "cookie",
        "origin",
        "referer",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "te",
        "upgrade",
        "proxy-authorization",
        NAMESPACE_HEADER,
        PROOF_HEADER,
    }
)
DROPPED_RESPONSE_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})
RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[0-9a-f]+)"')
RESPONSE_ID_SCAN_BYTES = 64 * 1024
INSTANCES_CACHE_S = 0.25  # the live list is read from Redis at most this often
# Instances one request is sent to at most: one that refuses the connection, takes the
# request and fails before its status line, or is not ready for it (NOT_READY), is
# followed by the next replica (or, for a stored response, by its holder's restart).
CONNECT_ATTEMPTS = 4
# An instance's 503s that mean nothing ran: its model is still loading (a restarted
# process answering under its predecessor's registration) or it is shutting down. Named in
# ERROR_TYPE_HEADER whatever the route's error shape (pantheon_platform/errors.py).
NOT_READY = frozenset({"no_models_loaded", "model_loading", "server_shutting_down"})
# A stored response's instance is down: it is back when its supervisor has restarted it
# and its model has loaded (seconds on the shipped models).
HOLDER_RETRY_AFTER_S = 5
HOLDER_POLL_S = 0.25  # how often a request waiting for its response's instance looks again


def is_forwarded(path: str) -> bool:
    return path in FORWARDED_PATHS or path.startswith(FORWARDED_PREFIXES)


class Dispatcher:
    """The ASGI app of the forwarded routes (one per router process)."""

    def __init__(self):
        self.in_flight: dict[str, int] = defaultdict(int)
        self._client: httpx.AsyncClient | None = None
        self._instances: list[Instance] = []
        self._instances_at = 0.0

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:  # made on the serving loop, on first use
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
            )
        return self._client

    async def instances(self, fresh: bool = False) -> list[Instance]:
        if fresh or time.monotonic() - self._instances_at > INSTANCES_CACHE_S:
            self._instances = await asyncio.to_thread(get_registry().instances)
            self._instances_at = time.monotonic()
        return self._instances

    async def __call__(self, scope, receive, send):
        path = scope["path"]
        body = await _read_body(receive)
        if body is None:
            return  # the client left before sending its body
        try:
            target = Target(scope, await json_object(body, skip_blob=path == "/session/restore"))
            await self.forward(scope, receive, send, body, target)
        except redis.RedisError as exc:
            error = registry_unavailable(exc)
            await send_asgi_error(
                send, error.status, error.message, error.type, _byte_headers(error), path
            )
        except ApiError as error:
            await send_asgi_error(
                send, error.status, error.message, error.type, _byte_headers(error), path
            )

    async def place(self, target: Target, tried: dict[str, float]) -> Instance:
        """Where the request goes, none of the processes in `tried` (id: started_at; one
        restarted under the same id since is a new process and may take it)."""
        instances = await self.instances(fresh=bool(tried))
        exclude = _exclusions(instances, tried)
        registry = get_registry()
        if target.response_id:
            held = await asyncio.to_thread(
                registry.response_instance, target.namespace, target.response_id
            )
            if held is not None:
                return await self._holder(
                    held, instances, tried, f"response {target.response_id!r}"
                )
        if target.session_id:
            held = await asyncio.to_thread(
                registry.session_instance, target.namespace, target.session_id
            )
            if target.path.startswith("/session/") and _registered(instances, held):
                # A session route acts on the session where it is (a release elsewhere
                # would answer 200 and leave it held): its instance, registered but not
                # serving (restarting, loading), is waited for as a response's holder is.
                return await self._holder(
                    held, instances, tried, f"session {target.session_id!r}", gone_ok=True
                )
            inst = placement.pinned(instances, held, target.model)
            if inst is not None and inst.id not in exclude:
                return inst
            target.rehomed = held is not None
        try:
            return placement.choose(instances, target.model, self.in_flight, exclude=exclude)
        except ApiError:
            if time.monotonic() - self._instances_at < 0.01:
                raise
            # The cached list may predate a registration or a freed replica: read it again.
            instances = await self.instances(fresh=True)
            exclude = _exclusions(instances, tried)
            return placement.choose(instances, target.model, self.in_flight, exclude=exclude)

    async def _holder(
        self,
        held: str,
        instances: list[Instance],
        tried: dict[str, float],
        what: str,
        gone_ok: bool = False,
    ) -> Instance:
        """The instance `held` (that stored a response, or holds the session a session
        route acts on; `what` names it in the 503), waited for while it is down or not
        ready (up to PANTHEON_HOLDER_WAIT_MS), then 503: only it has the response (a
        replica would answer 404 not found), and the registry records no instance as gone
        for good (one restarted under the same id serves its stored responses again), so
        the client is told to retry. A holder process that already failed this request is
        waited for in the same way: its restart may take it. `gone_ok`: once the holder
        is not registered at all (its heartbeats lapsed), any replica may take the request
        instead (a session's route: the session is gone with it)."""

        def usable(instances: list[Instance]) -> Instance | None:
            inst = placement.pinned(instances, held, None)
            return None if inst is None or tried.get(inst.id) == inst.started_at else inst

        inst = usable(instances)
        # A killed instance is back (restarted by its supervisor, reloaded) within seconds:
        # the request waits for it rather than answer 503 at once. The first read is fresh
        # because the cached list may predate its return.
        deadline = time.monotonic() + settings.PANTHEON_HOLDER_WAIT_S
        while inst is None:
            instances = await self.instances(fresh=True)
            inst = usable(instances)
            if inst is None:
                if gone_ok and not _registered(instances, held):
                    exclude = _exclusions(instances, tried)
                    return placement.choose(instances, None, self.in_flight, exclude=exclude)
                if time.monotonic() >= deadline:
                    raise holder_unavailable(what)
                await asyncio.sleep(HOLDER_POLL_S)
        return inst

    async def forward(self, scope, receive, send, body: bytes, target: Target) -> None:
        # The processes (id: started_at) that refused the connection, failed before their
        # status line or were not ready; `failed`: the ids of those that took the request.
        tried: dict[str, float] = {}
        failed: set[str] = set()
        attempts = 0
        while True:
            inst = await self._next_instance(target, tried, failed, attempts)
            attempts += 1
            request = self.client.build_request(
                scope["method"],
                inst.url + _path_and_query(scope),
                headers=self._headers(scope, target),
                content=body,
            )
            self.in_flight[inst.id] += 1
            try:
                try:
                    upstream = await self.client.send(request, stream=True)
                    if upstream.headers.get(ERROR_TYPE_HEADER) in NOT_READY:
                        # Loading or stopping: nothing ran there. The next replica.
                        await upstream.aclose()
                        tried[inst.id] = inst.started_at
                        continue
                    if _no_room_for_rehomed(upstream, target):
                        await upstream.aclose()
                        body = await without_session(body)
                        target.session_id, target.session_dropped = None, True
                        continue
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    # Dead but not yet dropped (its heartbeats have not lapsed): the next
                    # replica. Nothing was sent, so nothing runs twice.
                    log.warning("instance %s unreachable (%s); trying another", inst.id, exc)
                    tried[inst.id] = inst.started_at
                    continue
                except httpx.HTTPError as exc:
                    # It took the request and died (or hung up) before its status line.
                    # Nothing has reached the client yet, so the request is sent again to
                    # another replica, placed as if that instance were gone. The price: the
                    # dead one may have run part of it (a stored response whose id no one
                    # saw, a session turn now re-prefilled elsewhere). After the status
                    # line it is never sent again: the stream ends in its format's error
                    # (_pump).
                    log.warning("instance %s failed before answering (%s); resending", inst.id, exc)
                    tried[inst.id] = inst.started_at
                    failed.add(inst.id)
                    continue
                try:
                    await self._relay(scope, receive, send, upstream, inst, target)
                finally:
                    await upstream.aclose()
                return
            finally:
                self.in_flight[inst.id] -= 1

    async def _next_instance(
        self, target: Target, tried: dict[str, float], failed: set[str], attempts: int
    ):
        """Where the request goes next, none of `tried`. When none is left, the caller's
        error: 502 instance_failed if an instance took the request and failed, else
        503 no_live_instance (or placement's own refusal: 429 all full)."""
        if attempts >= CONNECT_ATTEMPTS:
            if failed:
                raise instance_failed(failed)
            raise ApiError(
                503, f"no instance could take the request ({attempts} tried)", "no_live_instance"
            )
        try:
            return await self.place(target, tried)
        except ApiError as error:
            if failed and error.type in ("no_live_instance", INSTANCE_UNAVAILABLE):
                raise instance_failed(failed) from None
            raise

    def _headers(self, scope, target: Target) -> list[tuple[bytes, bytes]]:
        headers = [
            (k, v)
            for k, v in scope.get("headers", ())
            if k.decode("latin-1").lower() not in DROPPED_REQUEST_HEADERS
            and not (target.session_dropped and k.lower() == b"x-session-id")
        ]
        if settings.PANTHEON_ROUTER_KEY:
            headers.append((b"authorization", f"Bearer {settings.PANTHEON_ROUTER_KEY}".encode()))
        headers.append((NAMESPACE_HEADER.encode(), target.namespace.encode()))
        headers.append((PROOF_HEADER.encode(), forwarded.proof(target.namespace).encode()))
        return headers

    async def _relay(self, scope, receive, send, upstream, inst: Instance, target: Target):
        ok = 200 <= upstream.status_code < 300
        if ok and target.session_id:
            await asyncio.to_thread(
                get_registry().set_session, target.namespace, target.session_id, inst.id
            )
        await send(
            {
                "type": "http.response.start",
                "status": upstream.status_code,
                "headers": [
                    (k, v)
                    for k, v in upstream.headers.raw
                    if k.lower() not in DROPPED_RESPONSE_HEADERS
                ]
                + [(b"x-pantheon-instance", inst.id.encode())],
            }
        )
        sniff = ok and target.makes_response
        pump = asyncio.ensure_future(self._pump(send, upstream, inst, target, sniff))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, gone):
                task.cancel()  # the client left: the stream (and the instance's turn) ends
            await asyncio.gather(pump, gone, return_exceptions=True)
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            raise pump.exception()

    async def _pump(self, send, upstream, inst: Instance, target: Target, sniff: bool):
        seen = b""
        tail = StreamTail(target.path, upstream.headers.get("content-type", ""))
        try:
            async for chunk in upstream.aiter_raw():
                tail.saw(chunk)
                if sniff:
                    seen += chunk
                    found = RESPONSE_ID.search(seen)
                    if found or len(seen) > RESPONSE_ID_SCAN_BYTES:
                        sniff = False
                        if found:
                            await asyncio.to_thread(
                                get_registry().set_response,
                                target.namespace,
                                found.group(1).decode(),
                                inst.id,
                            )
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:  # the instance died mid-answer
            log.warning("instance %s broke off an answer: %s", inst.id, exc)
            event = tail.failure(f"instance {inst.id} failed mid-answer")
            if event:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _registered(instances: list[Instance], instance_id: str | None) -> bool:
    """`instance_id` is registered and not drained by a router (it may be loading or
    stopping: a restart under its id follows)."""
    return any(i.id == instance_id and not i.draining for i in instances)


def _exclusions(instances: list[Instance], tried: dict[str, float]) -> frozenset[str]:
    """The ids whose registered process is one in `tried` (a restart is not)."""
    return frozenset(i.id for i in instances if tried.get(i.id) == i.started_at)


def instance_failed(failed: set[str]) -> ApiError:
    """An instance took the request and failed before answering, and no other could take
    it: the format's error, not the server's bare 500."""
    names = ("instances " if len(failed) > 1 else "instance ") + ", ".join(sorted(failed))
    return ApiError(502, f"{names} failed before answering", INSTANCE_FAILED)


def holder_unavailable(what: str) -> ApiError:
    """503 for a request about a stored response (or a session's route) whose instance is
    not live now."""
    return ApiError(
        503,
        f"the instance holding {what} is not available right now; retry when it is back",
        INSTANCE_UNAVAILABLE,
        headers={"Retry-After": str(HOLDER_RETRY_AFTER_S)},
    )


def _no_room_for_rehomed(upstream, target: Target) -> bool:
    """A dead instance's session found no session slot where it landed (that instance's
    sessions, or its key's cap there, are full): the turn had not begun, so it is sent
    again without its session id and re-prefills there, as any turn without one does,
    instead of a 429 its client cannot act on. Its next turn tries for a slot again."""
    return (
        target.rehomed
        and target.session_id is not None
        and not target.path.startswith("/session/")  # a session route needs its id
        and upstream.status_code == 429
        and upstream.headers.get(ERROR_TYPE_HEADER) == "model_at_session_capacity"
    )


async def _read_body(receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _path_and_query(scope) -> str:
    query = scope.get("query_string", b"")
    return scope["path"] + ("?" + query.decode("latin-1") if query else "")


def _byte_headers(error: ApiError) -> list[tuple[bytes, bytes]]:
    """The error's extra headers; send_asgi_error adds its type's header itself."""
    items = (error.headers or {}).items()
    return [(k.lower().encode(), str(v).encode()) for k, v in items if k != ERROR_TYPE_HEADER]
