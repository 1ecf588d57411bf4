"""The memory ladder's relief in every KV type: releasing a free slot hands back the
whole pages of its stored rows (128 bytes a position for f16 heads of 64, 68 for q8_0),
never a neighbour's, and parked copies keep the stored rows."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from kernels.kv_cache import KVCache


@pytest.mark.parametrize(("kv_dtype", "row"), [("f16", 128), ("q8_0", 68)])
def test_release_drops_the_freed_slot_s_whole_pages_of_narrow_rows(kv_dtype, row):
    kv = KVCache(n_layer=2, n_slots=3, n_kv_head=2, n_ctx=512, head_dim=64, kv_dtype=kv_dtype)
    assert kv.bytes_per_token() == 2 * 2 * 2 * row
    rng = np.random.default_rng(0)
    for slot in range(3):
        for layer in range(2):
            k = rng.standard_normal((2, 300, 64), dtype=np.float32)
            kv.write(layer, slot, 0, k, -k)
    before = [kv.view(1, s, 300)[0].copy() for s in range(3)]
    released = kv.release(1)
    # Per (layer, head) of K and V: the whole pages inside positions 0 .. 300 of the slot.
    head = 512 * row
    pages = 0
    for layer in range(2):
        for h in range(2):
            first = (layer * 3 + 1) * 2 * head + h * head
            pages += (first + 300 * row) // mmap.PAGESIZE - -(-first // mmap.PAGESIZE)
    assert released == 2 * pages * mmap.PAGESIZE > 0
    for s in (0, 2):
        np.testing.assert_array_equal(kv.view(1, s, 300)[0], before[s])
    saved_k, _ = kv.save(0, 300)
    assert saved_k.dtype == kv.k.dtype and saved_k.shape == (2, 2, 300, row // kv.dtype.itemsize)
    kv.load(1, saved_k, saved_k, 300)
    np.testing.assert_array_equal(kv.view(1, 1, 300)[0], before[0])
