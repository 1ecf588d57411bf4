"""Host copies on reused maps (kernels/host_buffers.py): a map goes back to the free list
only when no array can read it, and a copy of about its size then writes into it."""

import gc

import numpy as np
import pytest

from kernels import host_buffers
from kernels.kv_cache import KVCache


@pytest.fixture(autouse=True)
def empty_free_list():
    gc.collect()  # earlier tests' garbage files its maps now, not in the middle of a test
    host_buffers.trim()
    yield
    host_buffers.trim()


def source(n: int = 3000) -> np.ndarray:
    # (layer, slot, head, position, dh): a slot's positions are a strided view, as kv.save reads
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 2, 3, n, 64), dtype=np.float32)


def test_a_copy_is_contiguous_and_equal():
    kv = source()
    copy = host_buffers.host_copy(kv[:, 1, :, :2500])
    assert copy.flags.c_contiguous and copy.shape == (4, 3, 2500, 64)
    assert np.array_equal(copy, kv[:, 1, :, :2500])
    small = host_buffers.host_copy(kv[:1, 1, :1, :10])  # below 256 KB: numpy's own memory
    assert np.array_equal(small, kv[:1, 1, :1, :10])


def test_a_map_is_reused_only_after_its_last_view_is_gone():
    kv = source()
    first = host_buffers.host_copy(kv[:, 0, :, :3000])
    expected = first.copy()
    views = [first[:, 1], first[2:, :, 100:].reshape(-1), first.T, first[1][0]]
    del first
    gc.collect()
    assert host_buffers.free_bytes() == 0  # views still read the map
    # A new copy of the same size must not land on the memory the views read.
    second = host_buffers.host_copy(kv[:, 1, :, :3000])
    assert np.array_equal(views[0], expected[:, 1])
    assert np.array_equal(views[1], expected[2:, :, 100:].reshape(-1))
    assert np.array_equal(views[3], expected[1][0])
    nbytes = second.nbytes
    del views, second
    gc.collect()
    assert host_buffers.free_bytes() == 2 * nbytes  # both maps filed once unread


def test_a_free_map_serves_a_copy_of_about_its_size():
    kv = source()
    old = host_buffers.host_copy(kv[:, 0, :, :3000])
    address = old.__array_interface__["data"][0]
    del old
    assert host_buffers.free_bytes() > 0
    new = host_buffers.host_copy(kv[:, 1, :, :2800])  # within the slack: the same map
    assert new.__array_interface__["data"][0] == address
    assert np.array_equal(new, kv[:, 1, :, :2800])
    assert host_buffers.free_bytes() == 0
    del new
    much_smaller = host_buffers.host_copy(kv[:, 1, :, :1000])  # too much to spare: its own
    assert host_buffers.free_bytes() > 0
    assert np.array_equal(much_smaller, kv[:, 1, :, :1000])


def test_trim_hands_the_free_list_back():
    copy = host_buffers.host_copy(source()[:, 0])
    n = copy.nbytes
    del copy
    assert host_buffers.free_bytes() == n
    assert host_buffers.trim() == n
    assert host_buffers.free_bytes() == 0


def test_an_unkept_copy_goes_back_to_the_os_not_onto_the_free_list():
    kv = source()
    kept, unkept = host_buffers.host_copy(kv[:, 0]), host_buffers.host_copy(kv[:, 1])
    host_buffers.unkept(unkept[1:, :, 5:])  # any view of it says so
    n = kept.nbytes
    del unkept
    assert host_buffers.free_bytes() == 0
    del kept
    assert host_buffers.free_bytes() == n
    host_buffers.unkept(np.zeros(3))  # numpy's own memory: nothing to do


def test_a_fresh_map_sends_back_as_much_of_the_smaller_free_maps():
    """Maps freed that fit no later request are not held beside the fresh one it needs:
    free maps no larger than it go back, oldest first, up to its size."""
    kv = source(4000)
    a, b, c = (host_buffers.host_copy(kv[:, 0, :, :n]) for n in (300, 400, 500))
    sizes = [a.nbytes, b.nbytes, c.nbytes]
    del a, b, c  # three small maps on the free list, oldest first
    big = host_buffers.host_copy(kv[:, 0, :, :600])  # fits none of them: a fresh map
    # The oldest go until the fresh map's size is reached: 300 + 400 >= 600 positions.
    assert host_buffers.free_bytes() == sizes[2]
    other = host_buffers.host_copy(kv[:, 1, :, :350])  # fits no free map either
    assert host_buffers.free_bytes() == sizes[2]  # and a bigger free map is never closed for it
    del big, other


def test_kv_save_copies_survive_the_slot_being_rewritten():
    cache = KVCache(n_layer=4, n_slots=2, n_kv_head=3, n_ctx=4096, head_dim=64)
    rows = np.random.default_rng(1).standard_normal((3, 4000, 64), dtype=np.float32)
    for layer in range(4):
        cache.write(layer, 0, 0, rows, -rows)
    k, v = cache.save(0, 4000)
    for layer in range(4):
        cache.write(layer, 0, 0, rows * 2, rows * 2)
    assert np.array_equal(k[2], rows) and np.array_equal(v[3], -rows)
