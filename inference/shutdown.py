"""Moved to pantheon_platform.shutdown; shim for in-flight code, removed when nothing imports it.

`inference.shutdown` is the very module `pantheon_platform.shutdown` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import shutdown as _moved

sys.modules[__name__] = _moved
