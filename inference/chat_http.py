"""Moved to pantheon_platform.chat_http; shim for in-flight code, removed when nothing imports it.

`inference.chat_http` is the very module `pantheon_platform.chat_http` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import chat_http as _moved

sys.modules[__name__] = _moved
