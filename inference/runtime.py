"""Moved to pantheon_platform.runtime; shim for in-flight code, removed when nothing imports it.

Every name is pantheon_platform.runtime's; `runtime` (the old module-level registry) is
now `get_runtime()`, answered per lookup so a registry a test puts in place is seen."""

from pantheon_platform import runtime as _moved


def __getattr__(name):
    if name == "runtime":
        return _moved.get_runtime()
    return getattr(_moved, name)
