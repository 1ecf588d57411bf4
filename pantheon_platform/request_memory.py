"""A served request's memory back at once, not at the collector's next full pass.

Django builds reference cycles around every request. A cycle is freed only by the cyclic
collector, and a request lives long enough (a prefill, a 2 MB body's tokenization) for
its objects to be promoted to the oldest generation, collected every ~35-90 s under
load. Until then the request's body and its response's content stay in memory: under a
flood of 2 MB `/tokenize` bodies, ~6 MB a request piled up between full collections and
were freed together, the soak's RSS sawtooth (bench/RESULTS.md, 2026-12-04). Two cycles
held them:

- the handler's own frame: `ASGIHandler.handle` waits on a disconnect listener that
  raises RequestAborted when the client goes (every request: the contract closes each
  connection); the task keeps the exception, whose traceback holds `handle`'s frame,
  whose locals hold the task, the request and the response. `ASGIHandler` here lets the
  listener return instead: `handle` cancels the view's task on either outcome alike.
- the request's attributes: AuthenticationMiddleware's `request.auser = partial(auser,
  request)` and `request.user = SimpleLazyObject(lambda: get_user(request))`,
  MessageMiddleware's storage that holds the request. `release` drops them (and the
  body) when the response closes (middleware.CorsMiddleware registers it).
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler
from django.http import HttpRequest

from .request_threads import RequestThreads

# Attributes through which a request refers to itself, and those holding its body.
CYCLIC = ("auser", "user", "_cached_user", "_acached_user", "_messages")
HEAVY = ("_body", "_stream", "_post", "_files")


def release(request: HttpRequest) -> None:
    """Drop what a served request holds (CYCLIC, HEAVY); nothing reads it afterwards."""
    for name in (*CYCLIC, *HEAVY):
        request.__dict__.pop(name, None)


class ASGIHandler(DjangoASGIHandler):
    """Django's handler, its disconnect listener without the exception (see above), its
    thread-sensitive calls on kept threads (request_threads.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # as Django: it serves nothing else
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with self.threads.lend():
            await self.handle(scope, receive, send)

    async def listen_for_disconnect(self, receive):
        message = await receive()
        if message["type"] != "http.disconnect":  # as Django: never happens
            raise AssertionError(f"Invalid ASGI message after request body: {message['type']}")
