"""CORS for every response, the OPTIONS preflight on any path, and a request's memory
handed back when its response closes."""

from __future__ import annotations

import functools

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from .request_memory import release


class CorsMiddleware:
    """Outermost middleware: every response carries `Access-Control-Allow-Origin: *`
    (the contract), and OPTIONS on any path, known or not, answers 200 `{}` without
    reaching routing, CSRF or a view; each response, once sent and closed, releases its
    request (request_memory.release). Sync and async capable, so the async chat view is
    not pushed onto a worker thread."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self.__acall__(request)
        response = self._preflight(request) or self.get_response(request)
        return self._release_on_close(request, self._add_headers(response))

    async def __acall__(self, request: HttpRequest):
        response = self._preflight(request) or await self.get_response(request)
        return self._release_on_close(request, self._add_headers(response))

    @staticmethod
    def _release_on_close(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        """Once Django has sent `response` and closes it: break the request's cycles and
        drop its body (request_memory.release)."""
        response._resource_closers.append(functools.partial(release, request))
        return response

    @staticmethod
    def _preflight(request: HttpRequest) -> HttpResponse | None:
        if request.method != "OPTIONS":
            return None
        response = HttpResponse(b"{}", content_type="application/json")
        response["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
        # Echo what the browser asks for (Content-Type, Authorization, X-Session-Id ...).
        requested = request.headers.get("Access-Control-Request-Headers")
        response["Access-Control-Allow-Headers"] = requested or "*"
        response["Access-Control-Max-Age"] = "86400"
        return response

    @staticmethod
    def _add_headers(response: HttpResponse) -> HttpResponse:
        response["Access-Control-Allow-Origin"] = "*"
        # The contract: one request per connection (clients reconnect; no idle keep-alive).
        response["Connection"] = "close"
        return response
