"""Moved to pantheon_platform.errors; shim for in-flight code, removed when nothing imports it.

`inference.errors` is the very module `pantheon_platform.errors` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import errors as _moved

sys.modules[__name__] = _moved
