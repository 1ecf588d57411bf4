"""The tests marked `slow` (tests/conftest.py): files or test ids as pytest names them
(from the repository root), that took more than a few seconds on the 2-core host in a full run
(`pytest --durations=0`). `make test-fast` leaves them out; `make test` runs them."""

SLOW: frozenset[str] = frozenset()
