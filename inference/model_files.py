"""Moved to pantheon_platform.model_files; shim for in-flight code, removed when nothing imports it.

`inference.model_files` is the very module `pantheon_platform.model_files` (private names and monkeypatching
included)."""

import sys

from pantheon_platform import model_files as _moved

sys.modules[__name__] = _moved
