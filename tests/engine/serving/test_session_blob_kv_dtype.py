"""Session blobs in each KV type: a blob carries the rows as the cache stores them and
names the type; decoding refuses a blob of another type than the model's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.serving.session_blob import KVLayout, SessionSnapshot, encode
from engine.serving.session_blob_read import decode, read_header
from engine.types import BadSessionBlob
from kernels import kv_types

TOKENS = (1, 2, 3, 4, 5)


def snapshot(kv_dtype: str, head_dim: int = 64) -> SessionSnapshot:
    layout = KVLayout("llama", "w1", n_layer=2, n_kv_head=2, head_dim=head_dim, kv_dtype=kv_dtype)
    rng = np.random.default_rng(0)
    values = rng.standard_normal((2, 2, len(TOKENS), head_dim), dtype=np.float32)
    rows = kv_types.encode(np, values, kv_dtype)
    return SessionSnapshot(layout, TOKENS, rows, rows[::-1].copy())


@pytest.mark.parametrize(
    ("kv_dtype", "name", "row_bytes"),
    [("f32", "float32", 256), ("f16", "float16", 128), ("q8_0", "q8_0", 68)],
)
def test_a_blob_round_trips_the_stored_rows_and_names_their_type(kv_dtype, name, row_bytes):
    snap = snapshot(kv_dtype)
    blob = encode(snap)
    header = read_header(blob)
    assert header["kv_dtype"] == name
    payload = 2 * 2 * 2 * len(TOKENS) * row_bytes
    assert len(blob) - payload - 32 in range(16, 16 + 4096)
    out = decode(blob, snap.layout)
    assert out.layout.kv_dtype == kv_dtype
    assert out.k.dtype == snap.k.dtype and np.array_equal(out.k, snap.k)
    assert np.array_equal(out.v, snap.v)


@pytest.mark.parametrize(
    ("blob_type", "model_type"), [("f16", "f32"), ("f32", "q8_0"), ("q8_0", "f16")]
)
def test_a_blob_of_another_kv_type_is_refused(blob_type, model_type):
    blob = encode(snapshot(blob_type))
    expect = replace(snapshot(blob_type).layout, kv_dtype=model_type)
    with pytest.raises(BadSessionBlob, match=f"KV cache type is {blob_type}.*as {model_type}"):
        decode(blob, expect)


def test_q8_0_rows_need_heads_of_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32"):
        encode(
            snapshot("q8_0", head_dim=64).__class__(
                KVLayout("llama", "w1", 2, 2, 48, "q8_0"), TOKENS, np.zeros(1), np.zeros(1)
            )
        )


def test_rows_of_the_wrong_element_type_are_a_programming_error():
    snap = snapshot("f16")
    with pytest.raises(ValueError, match="float16"):
        encode(replace(snap, k=snap.k.astype(np.float32)))
