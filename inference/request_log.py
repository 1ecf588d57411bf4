"""Moved to pantheon_platform.request_log; shim for in-flight code, removed when nothing imports it.

`inference.request_log` is the very module `pantheon_platform.request_log` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import request_log as _moved

sys.modules[__name__] = _moved
