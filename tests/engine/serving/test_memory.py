"""The memory-pressure ladder and the KV cache's page release, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from engine.serving.memory import CRITICAL, MemoryLadder
from kernels.kv_cache import KVCache

GiB = 1 << 30


class Probe:
    def __init__(self, free: float) -> None:
        self.free = free

    def __call__(self) -> tuple[int, int]:
        return int(self.free * 16 * GiB), 16 * GiB


def test_the_ladder_steps_down_one_level_per_observation_and_back_up_with_a_margin():
    probe = Probe(0.5)
    ladder = MemoryLadder(8, 8192, probe)
    assert not ladder.observe()
    assert (ladder.level_name, ladder.slots, ladder.window) == ("normal", 8, 8192)
    probe.free = 0.03  # critical at once is still reached one level per poll
    seen = []
    while ladder.observe():
        seen.append((ladder.level_name, ladder.slots, ladder.window))
    assert seen == [("elevated", 4, 8192), ("high", 2, 4096), ("critical", 1, 2048)]
    probe.free = 0.07  # above critical's 5 %, but not by the margin
    assert not ladder.observe()
    probe.free = 0.12
    assert ladder.observe() and ladder.level_name == "high"
    probe.free = 0.5
    assert ladder.observe() and ladder.observe() and ladder.level == 0


def test_the_window_never_drops_below_the_floor():
    ladder = MemoryLadder(1, 512, Probe(0.5))
    ladder.simulate(CRITICAL)
    assert ladder.slots == 1 and ladder.window == 256


def test_a_simulated_level_pins_the_ladder_until_cleared():
    probe = Probe(0.9)
    ladder = MemoryLadder(4, 8192, probe)
    assert ladder.simulate(2)
    assert (ladder.slots, ladder.window) == (1, 4096)
    assert not ladder.observe()  # the probe says all is well; the pin holds
    assert ladder.available_bytes() < 0.1 * 16 * GiB
    assert ladder.simulate(None)
    assert ladder.level == 0 and ladder.available_bytes() == probe()[0]
    with pytest.raises(ValueError):
        ladder.simulate(7)


def test_kv_release_drops_only_the_freed_slots_pages():
    kv = KVCache(n_layer=2, n_slots=3, n_kv_head=2, n_ctx=256, head_dim=64)
    rng = np.random.default_rng(0)
    for slot in range(3):
        for layer in range(2):
            k = rng.standard_normal((2, 100, 64), dtype=np.float32)
            kv.write(layer, slot, 0, k, -k)
    before = [kv.view(1, s, 100)[0].copy() for s in range(3)]
    released = kv.release(1)
    # Whole pages only: 96 of the 100 written positions (256 bytes each, 4 KiB pages).
    assert released == 2 * 2 * 2 * 96 * 64 * 4
    assert not kv.k[:, 1, :, :96].any() and not kv.v[:, 1, :, :96].any()  # read as zeros
    for s in (0, 2):
        np.testing.assert_array_equal(kv.view(1, s, 100)[0], before[s])
    assert kv.release(1) == 0  # nothing written since


def test_kv_release_past_what_a_kept_slot_keeps_drops_only_the_dead_positions():
    """A slot the prefix cache keeps with 40 positions, after a 200-position sequence had
    written there: the pages past position 40 go back, the first 40 positions stay."""
    kv = KVCache(n_layer=2, n_slots=2, n_kv_head=2, n_ctx=256, head_dim=64)
    rng = np.random.default_rng(1)
    for layer in range(2):
        k = rng.standard_normal((2, 200, 64), dtype=np.float32)
        kv.write(layer, 0, 0, k, -k)
        kv.write(layer, 1, 0, k, -k)
    kept = [kv.view(layer, 0, 40)[0].copy() for layer in range(2)]
    other = kv.view(1, 1, 200)[0].copy()
    released = kv.release(0, keep=40)
    # Positions 48 .. 192 are whole pages (16 positions each): 144 per head, layer, k and v.
    assert released == 2 * 2 * 2 * 144 * 64 * 4
    for layer in range(2):
        np.testing.assert_array_equal(kv.view(layer, 0, 40)[0], kept[layer])
    assert not kv.k[:, 0, :, 48:192].any() and not kv.v[:, 0, :, 48:192].any()
    np.testing.assert_array_equal(kv.view(1, 1, 200)[0], other)
    assert kv.release(0, keep=40) == 0  # nothing written past 40 since
    assert kv.release(0) == 2 * 2 * 2 * 32 * 64 * 4  # the rest: positions 0 .. 32


def test_kv_copy_prefix_shares_a_prompt():
    kv = KVCache(n_layer=1, n_slots=2, n_kv_head=1, n_ctx=16, head_dim=4)
    k = np.arange(40, dtype=np.float32).reshape(1, 10, 4)
    kv.write(0, 0, 0, k, k + 1)
    kv.copy_prefix(0, 1, 10)
    np.testing.assert_array_equal(kv.view(0, 1, 10)[0], k)
    np.testing.assert_array_equal(kv.view(0, 1, 10)[1], k + 1)
