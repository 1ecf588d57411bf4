"""The ASGI layers around the application, outermost first.

Security and bookkeeping live here, at the ASGI level, not in Django middleware: the
session watch is a Channels consumer that Django middleware never sees, and a body limit
must answer 413 before Django reads the body.
"""

from __future__ import annotations


def build(django_asgi_app):
    """The whole ASGI application around Django's handler (pantheon_site.asgi; tests
    build their own around get_asgi_application() without starting the model loader)."""
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
    from django.urls import path, re_path

    from sessions.consumers import SessionWatchConsumer

    # The console's CSS and JavaScript (/static/...), straight from the installed apps: no
    # collectstatic step and no second web server for a handful of admin files.
    # GET /session/watch is a long-held response: a Channels consumer, not a Django view.
    router = ProtocolTypeRouter(
        {
            "http": URLRouter(
                [
                    path("session/watch", SessionWatchConsumer.as_asgi()),
                    re_path(r"", ASGIStaticFilesHandler(django_asgi_app)),
                ]
            )
        }
    )
    return wrap(router)


def wrap(app):
    """`app` (the Channels router) inside every layer, outermost first in LAYERS."""
    for layer in reversed(LAYERS):
        app = layer(app)
    return app


def canonical_path(app):
    """scope["path"] rewritten to its canonical spelling (pantheon_platform.routes.canonical)
    before any layer or router reads it, so the scope a path needs and the route it reaches
    are decided on one string. Outermost. root_path is dropped: Pantheon is served at the
    root, and Daphne takes root_path from any client's Daphne-Root-Path header."""

    async def canonical(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            from urllib.parse import quote

            from pantheon_platform.routes import canonical

            path = canonical(scope.get("path") or "/")
            scope = {**scope, "path": path, "raw_path": quote(path).encode(), "root_path": ""}
        return await app(scope, receive, send)

    return canonical


def access_guard(app):
    """API keys, scopes, the per-key quota and the browser defences (access/guard.py).
    Inside the access log (refusals are logged with the key) and outside the body limit
    (a refused request is never read)."""
    from access.guard import AccessGuard

    return AccessGuard(app)


def access_log(app):
    """One JSON line per request on `pantheon.access` (pantheon_site/access_log.py).
    Outermost: every answer is logged, the other layers' refusals included."""
    from pantheon_site.access_log import AccessLog

    return AccessLog(app)


def body_limit(app):
    """413 for a body over its route class's limit, before Django reads it
    (pantheon_site/limits.py). Innermost: a request the guard refuses is never read."""
    from pantheon_site.limits import BodyLimit

    return BodyLimit(app)


# Each entry: a callable taking an ASGI app and returning one. Outermost first.
LAYERS: list = [canonical_path, access_log, access_guard, body_limit]
