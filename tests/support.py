"""Helpers shared by test modules and conftests (importable as `tests.support`)."""

from __future__ import annotations

import os

import pytest


def skip_or_fail(reason: str) -> None:
    """Skip when a test input is missing, except under `make test` (PANTHEON_TESTS_STRICT=1),
    which installs everything: there a missing model must fail the run, not hide tests."""
    if os.environ.get("PANTHEON_TESTS_STRICT") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
