"""pantheon_platform/gc_policy.py: start-up's objects frozen, garbage collected first."""

import gc
import weakref

import pytest

from pantheon_platform import gc_policy


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # the rest of the suite's collector as it was


class Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_garbage_is_collected_before_the_rest_is_frozen(unfrozen):
    gc.disable()  # no collection but the policy's own
    try:
        dead, alive = Node(), Node()
        gone = weakref.ref(dead)
        del dead
        before = gc.get_freeze_count()
        gc_policy.freeze_long_lived()
        assert gone() is None  # collected, not frozen
        assert gc.get_freeze_count() > before
        assert not any(o is alive for o in gc.get_objects(generation=2))  # frozen: unscanned
    finally:
        gc.enable()
