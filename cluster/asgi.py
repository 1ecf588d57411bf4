"""The router's ASGI application (PANTHEON_ROLE=router; pantheon_site.asgi): the forwarded
client routes go to the Dispatcher, everything else (the router's own routes, the
console) to Django, inside the same layers as a serve instance (pantheon_site.stack:
canonical path, access log, the key guard, body limits)."""

from __future__ import annotations

from cluster import restore_limit
from cluster.dispatch import Dispatcher, is_forwarded
from pantheon_platform.errors import send_asgi_error

# Served by each instance, not placed by the router yet: a file lives on one instance's
# disk and its batch runs there, and the router keeps no affinity for their ids. Refused
# here, clearly, rather than stored on the router where no batch would ever run.
INSTANCE_ONLY_PREFIXES = ("/v1/files", "/v1/batches")
INSTANCE_ONLY_MESSAGE = (
    "the Files and Batches APIs are served by each instance, not through the router: "
    "call an instance's URL directly (GET /admin/instances on the router lists them)"
)


def is_instance_only(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in INSTANCE_ONLY_PREFIXES)


def router_app(django_app):
    restore_limit.install()
    dispatcher = Dispatcher()

    async def app(scope, receive, send):
        if scope["type"] == "http" and is_forwarded(scope["path"]):
            return await dispatcher(scope, receive, send)
        if scope["type"] == "http" and is_instance_only(scope["path"]):
            return await send_asgi_error(
                send, 400, INSTANCE_ONLY_MESSAGE, "invalid_request_error", path=scope["path"]
            )
        return await django_app(scope, receive, send)

    app.dispatcher = dispatcher
    return app
