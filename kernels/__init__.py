"""Array backends behind one small interface: numpy reference, CuPy fast path.

Nothing here imports Django. `backend_name()` answers "what can this process run on?":
`cuda` when CuPy is installed and sees at least one usable device, else `cpu`.
"""

from __future__ import annotations

import functools


@functools.cache
def dies_visible() -> int:
    """Number of CUDA devices CuPy can use (0 without CuPy, driver or card)."""
    try:
        import cupy  # noqa: F401  (optional extra `cuda`)

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def backend_name() -> str:
    return "cuda" if dies_visible() > 0 else "cpu"


def accelerator_available() -> bool:
    return dies_visible() > 0
