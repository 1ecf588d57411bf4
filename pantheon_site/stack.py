"""The ASGI layers around the application, outermost first.

Security and bookkeeping live here, at the ASGI level, not in Django middleware: the
session watch is a Channels consumer that Django middleware never sees, and a body limit
must answer 413 before Django reads the body.
"""

from __future__ import annotations


def wrap(app):
    """`app` (the Channels router) inside every layer, outermost first in LAYERS."""
    for layer in reversed(LAYERS):
        app = layer(app)
    return app


# Each entry: a callable taking an ASGI app and returning one. Outermost first.
LAYERS: list = []
