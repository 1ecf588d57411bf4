"""Moved to pantheon_platform.sse; shim for in-flight code, removed when nothing imports it.

`inference.sse` is the very module `pantheon_platform.sse` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import sse as _moved

sys.modules[__name__] = _moved
