"""Compute backends behind one interface (kernels.backend.Backend): the numpy reference
now; quantised CPU kernels and CuPy are further backends behind the same seam.

Nothing here imports Django. `backend_name()` answers "what can this process run on?":
`cuda` when CuPy is installed and sees at least one usable device, else `cpu`.
`get_backend(name)` is how a model chooses its kernels at load time.
"""

from __future__ import annotations

import functools

from .backend import Backend


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


def _numpy() -> Backend:
    from .numpy_backend import NumpyBackend

    return NumpyBackend()


# name -> factory. A backend registers here and nowhere else: models never name one.
BACKENDS = {"numpy": _numpy}
DEFAULT_BACKEND = "numpy"


@functools.cache
def get_backend(name: str = DEFAULT_BACKEND) -> Backend:
    """The backend called `name` (one shared instance per process)."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}") from None
    return factory()
