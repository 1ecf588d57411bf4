"""The in-process Django fixtures of tests/wire (the async client, raw ASGI, the SmolLM2
variants) for the sessions tests."""

from tests.wire.conftest import *  # noqa: F403
