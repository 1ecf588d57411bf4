"""The server's ASGI application with one model's load held at two points until the test
lets it go, so a browser can watch its progress bar move (tests/e2e/test_console_dashboard.py).

A real load: the runtime's progress hook (Runtime.add_progress_hook, called on the
loading thread after each step) waits, for the model named by PANTHEON_TEST_HELD_LOAD,
once its load passes a quarter and again past three quarters, until the files `gate0`
and then `gate1` exist in the folder PANTHEON_TEST_LOAD_GATES.

Served as `daphne tests.e2e.held_load_asgi:application`; the hook is in place before
pantheon_site.asgi starts the start-up loads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
django.setup()

from pantheon_platform.runtime import get_runtime  # noqa: E402

HELD = os.environ["PANTHEON_TEST_HELD_LOAD"]
GATES = Path(os.environ["PANTHEON_TEST_LOAD_GATES"])
HOLD_AT = (0.25, 0.75)  # fractions of the load past which it waits for gate0, gate1


def hold(name: str, progress) -> None:
    if name != HELD:
        return
    for i, fraction in enumerate(HOLD_AT):
        gate = GATES / f"gate{i}"
        # A file the test writes from another process: polled, there is nothing to wait on.
        while progress.fraction >= fraction and not gate.exists():
            time.sleep(0.05)


get_runtime().add_progress_hook(hold)

from pantheon_site.asgi import application  # noqa: E402, F401
