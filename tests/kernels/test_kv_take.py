"""KVCache.take: a slot about to be overwritten spilled by moving its pages (page_moves)
gives what a copy gives, keeps the positions asked for, touches no other slot, and falls
back to a copy where pages cannot move."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import host_buffers, kv_cache, page_moves
from kernels.kv_cache import KVCache


@pytest.fixture(autouse=True)
def _no_free_maps_left():
    yield
    host_buffers.trim()  # the copies' maps go back to the OS, not to the next test


def _filled(kv_dtype: str, n: int) -> KVCache:
    kv = KVCache(3, 3, 2, 1024, 64, kv_dtype=kv_dtype)
    rng = np.random.default_rng(7)
    for slot in range(3):
        for layer in range(3):
            k = rng.standard_normal((2, n, 64)).astype(np.float32)
            v = rng.standard_normal((2, n, 64)).astype(np.float32)
            kv.write(layer, slot, 0, k, v)
    return kv


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("keep", [0, 37, 300])
def test_take_gives_what_save_gives_and_keeps_the_first_positions(kv_dtype, keep):
    n = 900
    kv = _filled(kv_dtype, n)
    saved = kv.save(1, n)
    neighbours = [kv.save(slot, n) for slot in (0, 2)]
    k, v = kv.take(1, n, keep)
    assert k.shape == saved[0].shape and v.shape == saved[1].shape
    assert np.array_equal(k, saved[0]) and np.array_equal(v, saved[1])
    assert np.array_equal(kv.k[:, 1, :, :keep], saved[0][:, :, :keep])
    assert np.array_equal(kv.v[:, 1, :, :keep], saved[1][:, :, :keep])
    for slot, before in zip((0, 2), neighbours, strict=True):
        after = kv.save(slot, n)
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
    # The slot takes new rows as before; the copy is unaffected.
    kv.write(
        0, 1, keep, np.ones((2, n - keep, 64), np.float32), np.ones((2, n - keep, 64), np.float32)
    )
    assert np.array_equal(k, saved[0])


@pytest.mark.skipif(not page_moves.available(), reason="pages cannot move on this OS")
def test_the_pages_past_keep_really_moved():
    """The moving path ran: whole pages past `keep` are gone from the slot (zeros), not
    copied and left there."""
    n, keep = 900, 100
    kv = _filled("f32", n)
    k, _ = kv.take(1, n, keep)
    row = 64 * 4
    first_whole = -(-keep * row // page_moves.PAGE) * page_moves.PAGE // row
    assert first_whole < n - 1
    assert not np.any(kv.k[:, 1, :, first_whole : n - 16])
    assert np.any(k[:, :, first_whole : n - 16])


def test_a_copy_where_pages_cannot_move(monkeypatch):
    n = 900
    kv = _filled("f32", n)
    saved = kv.save(1, n)
    monkeypatch.setattr(page_moves, "_broken", True)
    k, v = kv.take(1, n, 0)
    assert np.array_equal(k, saved[0]) and np.array_equal(v, saved[1])
    assert np.array_equal(kv.k[:, 1, :, :n], saved[0])  # copied: the slot still holds it


def test_a_short_run_is_copied_not_moved():
    n = kv_cache.MIN_MOVE_BYTES // (64 * 4) - 1
    kv = _filled("f32", n)
    saved = kv.save(1, n)
    k, _ = kv.take(1, n, 0)
    assert np.array_equal(k, saved[0]) and np.array_equal(kv.k[:, 1, :, :n], saved[0])


@pytest.mark.skipif(not page_moves.available(), reason="pages cannot move on this OS")
def test_moves_are_counted_until_their_copy_is_unmapped_and_refused_past_the_budget(monkeypatch):
    """Each moved run is a mapping of its own (vm.max_map_count): counted while its copy
    lives, handed back when the map is unmapped, and past the budget take copies."""
    n = 900
    kv = _filled("f32", n)
    saved = kv.save(1, n)
    host_buffers.trim()  # no free map for take's fresh ones to send back meanwhile
    held = page_moves._held
    k, v = kv.take(1, n, 0)
    runs = 2 * 3 * 2  # K and V, 3 layers, 2 heads
    assert page_moves._held == held + 2 * runs
    del k, v
    host_buffers.trim()  # the maps left the free list: unmapped
    assert page_moves._held == held

    kv = _filled("f32", n)
    monkeypatch.setattr(page_moves, "BUDGET", page_moves._held + 2 * runs - 1)
    k, v = kv.take(1, n, 0)
    assert page_moves._held == held  # nothing moved: copied
    assert np.array_equal(k, saved[0]) and np.array_equal(kv.k[:, 1, :, :n], saved[0])


def test_a_small_copy_still_gets_a_map_of_its_own():
    """One layer and head: the copy is under host_empty's 256 KB floor, where arrays come
    from malloc's heap; pages moved there would replace the heap's. It gets a map."""
    kv = KVCache(1, 2, 1, 1024, 64)
    n = 600  # 150 KB a run: moved
    kv.write(0, 1, 0, np.ones((1, n, 64), np.float32), np.full((1, n, 64), 2.0, np.float32))
    k, v = kv.take(1, n, 0)
    assert host_buffers._map_of(k) is not None and host_buffers._map_of(v) is not None
    assert (k == 1.0).all() and (v == 2.0).all()
