"""The Files and Batches tests' fixtures (tests/wire/files/sdk_helpers.py)."""

from tests.wire.files.sdk_helpers import app, files_dir  # noqa: F401
