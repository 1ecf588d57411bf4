"""The router's ASGI application (PANTHEON_ROLE=router; pantheon_site.asgi): the forwarded
client routes go to the Dispatcher, everything else (the router's own routes, the
console) to Django, inside the same layers as a serve instance (pantheon_site.stack:
canonical path, access log, the key guard, body limits)."""

from __future__ import annotations

from cluster import restore_limit
from cluster.dispatch import Dispatcher, is_forwarded


def router_app(django_app):
    restore_limit.install()
    dispatcher = Dispatcher()

    async def app(scope, receive, send):
        if scope["type"] == "http" and is_forwarded(scope["path"]):
            return await dispatcher(scope, receive, send)
        return await django_app(scope, receive, send)

    app.dispatcher = dispatcher
    return app
