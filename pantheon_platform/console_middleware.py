"""Django's middlewares where they do something: the console's session, CSRF, login and
messages on the console's paths only; the security and framing headers on every response,
without a thread hop.

Each of Django's own middlewares runs its hooks on a worker thread under an async server
(`MiddlewareMixin.__acall__`: `sync_to_async(thread_sensitive=True)`), ten hops per
request for these six, and the first one starts a thread for the request's context. The
API routes use none of what they set up (DRF authenticates nobody here: settings
REST_FRAMEWORK), yet a burst of 8 chat requests spent ~7 ms of event-loop time per
request on those hops (py-spy, bench/RESULTS.md 2026-12-04 third session), every stream
waiting behind them for its first token. The console (`/console/`, the Django admin:
sessions and the database) keeps the full chain as Django builds it.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware

CONSOLE_PREFIX = "/console"
# Outermost first, as settings.MIDDLEWARE listed them.
CONSOLE_CHAIN = (
    SecurityMiddleware,
    SessionMiddleware,
    CsrfViewMiddleware,
    AuthenticationMiddleware,
    MessageMiddleware,
    XFrameOptionsMiddleware,
)


def is_console(request: HttpRequest) -> bool:
    return request.path_info.startswith(CONSOLE_PREFIX)


class ConsoleMiddleware:
    """In settings.MIDDLEWARE where Django's six stood. Sync and async capable (the test
    client's handler is sync); the hops it saves are the async handler's."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        chain = get_response
        for cls in reversed(CONSOLE_CHAIN):
            chain = cls(chain)
        self.console = chain
        # The same classes' hooks, called inline for every other path: they only read the
        # request and set headers (no database, no session).
        self.security = SecurityMiddleware(get_response)
        self.framing = XFrameOptionsMiddleware(get_response)
        # Django's handler calls process_view of the middlewares it was given: CSRF's is
        # one, and must still run for the console's views.
        self.csrf = CsrfViewMiddleware(get_response)
        # Django's handler picks this hook's mode by whether it is a coroutine function.
        self.process_view = self._aprocess_view if self.is_async else self._process_view
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        if is_console(request):
            return self.console(request)
        response = self.security.process_request(request) or self.get_response(request)
        return self._headers(request, response)

    async def __acall__(self, request: HttpRequest):
        if is_console(request):
            return await self.console(request)
        response = self.security.process_request(request) or await self.get_response(request)
        return self._headers(request, response)

    def _headers(self, request: HttpRequest, response):
        response = self.framing.process_response(request, response)
        return self.security.process_response(request, response)

    def _process_view(self, request, view, args, kwargs):
        if not is_console(request):
            return None
        return self.csrf.process_view(request, view, args, kwargs)

    async def _aprocess_view(self, request, view, args, kwargs):
        if not is_console(request):
            return None  # no hop: this is what the async handler awaits for every view
        return await sync_to_async(self.csrf.process_view, thread_sensitive=True)(
            request, view, args, kwargs
        )
