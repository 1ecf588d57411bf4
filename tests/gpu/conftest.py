"""tests/gpu: the GPU backend's array logic (kernels/xp/backend.py) on a CUDA device, with
xp = CuPy, against the same logic on numpy (issue 16).

Where CuPy or a device is missing these tests skip, saying why; PANTHEON_REQUIRE_GPU=1
(set by tests/gpu/run-on-device.sh) makes that a failure. Nothing here needs Django: the
device script runs this folder alone (--confcutdir), with gguf as its only carried wheel.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def cp():
    """The cupy module, with at least one usable device."""
    why = None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            why = "CuPy sees no CUDA device"
    except Exception as exc:  # ImportError, or a CUDA driver/runtime error
        why = f"CuPy is not usable here ({type(exc).__name__}: {exc})"
    if why:
        if os.environ.get("PANTHEON_REQUIRE_GPU") == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return cupy
