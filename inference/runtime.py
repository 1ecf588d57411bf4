"""Moved to pantheon_platform.runtime; shim for in-flight code, removed when nothing imports it."""

import sys

from pantheon_platform import runtime as _moved

sys.modules[__name__] = _moved
