"""Moved to pantheon_platform.middleware; shim for in-flight code, removed when nothing imports it.

`inference.middleware` is the very module `pantheon_platform.middleware` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import middleware as _moved

sys.modules[__name__] = _moved
