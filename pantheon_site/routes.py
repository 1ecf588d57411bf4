"""Moved to pantheon_platform.routes; shim for in-flight code, removed when nothing imports it."""

import sys

from pantheon_platform import routes as _moved

sys.modules[__name__] = _moved
