"""Session blobs: round trip, and every way a blob is refused, in the documented order."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.serving.session_blob import (
    FORMAT_VERSION,
    MAGIC,
    KVLayout,
    SessionSnapshot,
    encode,
    encode_parts,
)
from engine.serving.session_blob_read import decode, read_header
from engine.types import BadSessionBlob, WeightsVersionMismatch
from sessions.persistence import write_atomic

REPO_ROOT = Path(__file__).resolve().parents[3]
LAYOUT = KVLayout("llama", "abcdef0123456789", n_layer=3, n_kv_head=2, head_dim=8)
TOKENS = (1, 15043, 3186, 29991, 2**31 - 1, 0, 7)


def snapshot(layout: KVLayout = LAYOUT, tokens=TOKENS, seed: int = 0, **kw) -> SessionSnapshot:
    rng = np.random.default_rng(seed)
    shape = (layout.n_layer, layout.n_kv_head, len(tokens), layout.head_dim)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    return SessionSnapshot(layout, tuple(tokens), k, v, **kw)


def parts(blob: bytes) -> tuple[dict, bytes]:
    """(header, K+V payload) of a well-formed blob."""
    (header_len,) = struct.unpack_from("<I", blob, 12)
    return json.loads(blob[16 : 16 + header_len]), blob[16 + header_len : -32]


def build(
    header: dict | bytes,
    payload: bytes,
    *,
    magic: bytes = MAGIC,
    version: int = FORMAT_VERSION,
    header_len: int | None = None,
) -> bytes:
    """A blob from raw pieces with a correct checksum, so that what fails is the piece."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    size = len(raw) if header_len is None else header_len
    body = magic + struct.pack("<II", version, size) + raw + payload
    return body + hashlib.sha256(body).digest()


def rebuilt(blob: bytes, **changes) -> bytes:
    """`blob` with header fields changed (None deletes one) and the checksum recomputed."""
    header, payload = parts(blob)
    for key, value in changes.items():
        if value is None:
            del header[key]
        else:
            header[key] = value
    return build(header, payload)


@pytest.fixture(scope="module")
def blob() -> bytes:
    return encode(snapshot(session_id="chat-42", created=1_700_000_000.25))


def refused(blob, *needles: str, layout: KVLayout = LAYOUT) -> str:
    with pytest.raises(BadSessionBlob) as info:
        decode(blob, layout)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


# --- round trip ------------------------------------------------------------------------


def test_round_trip_is_bitwise_exact(blob):
    snap = snapshot(session_id="chat-42", created=1_700_000_000.25)
    out = decode(blob, LAYOUT)
    assert out.layout == LAYOUT
    assert out.tokens == TOKENS and out.n_tok == len(TOKENS)
    assert out.session_id == "chat-42" and out.created == 1_700_000_000.25
    assert out.k.dtype == np.float32 and out.k.shape == snap.k.shape
    assert out.k.tobytes() == snap.k.tobytes()
    assert out.v.tobytes() == snap.v.tobytes()


def test_special_float_values_survive_bit_for_bit():
    snap = snapshot()
    k = snap.k.copy()
    k.reshape(-1)[:5] = [np.nan, -0.0, np.inf, -np.inf, np.float32(1e-45)]
    bits = k.view(np.uint32).copy()
    out = decode(encode(replace(snap, k=k)), LAYOUT)
    assert np.array_equal(out.k.view(np.uint32), bits)


def test_the_layout_on_disk_is_the_documented_one(blob):
    assert blob[:8] == b"PNKVBLOB"
    version, header_len = struct.unpack_from("<II", blob, 8)
    assert version == FORMAT_VERSION == 1
    assert (16 + header_len) % 64 == 0  # the writer aligns K
    header, payload = parts(blob)
    assert set(header) == {
        "architecture",
        "weights_version",
        "kv_dtype",
        "n_layer",
        "n_kv_head",
        "head_dim",
        "n_tok",
        "tokens",
        "session_id",
        "created",
    }
    assert header["kv_dtype"] == "float32" and header["tokens"] == list(TOKENS)
    snap = snapshot()
    assert payload == snap.k.astype("<f4").tobytes() + snap.v.astype("<f4").tobytes()
    assert blob[-32:] == hashlib.sha256(blob[:-32]).digest()


def test_decode_returns_read_only_views_into_the_blob(blob):
    out = decode(blob, LAYOUT)
    whole = np.frombuffer(blob, np.uint8)
    assert np.shares_memory(out.k, whole) and np.shares_memory(out.v, whole)
    assert not out.k.flags.writeable and not out.v.flags.writeable
    mutable = decode(bytearray(blob), LAYOUT)
    assert not mutable.k.flags.writeable
    with pytest.raises(ValueError):
        mutable.k[0, 0, 0, 0] = 1.0


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_any_bytes_like_input(blob, wrap):
    out = decode(wrap(blob), LAYOUT)
    assert out.tokens == TOKENS
    assert read_header(wrap(blob))["session_id"] == "chat-42"


def test_null_and_non_ascii_session_ids():
    assert decode(encode(snapshot()), LAYOUT).session_id is None
    assert decode(encode(snapshot(session_id="café ☕")), LAYOUT).session_id == "café ☕"


def test_non_contiguous_and_numpy_token_inputs_encode():
    snap = snapshot()
    k = np.asfortranarray(snap.k)
    v = snap.v[:, ::-1].copy()[:, ::-1]  # a negative-stride view of the same values
    tokens = tuple(np.array(TOKENS, dtype=np.int64))
    out = decode(encode(replace(snap, k=k, v=v, tokens=tokens)), LAYOUT)
    assert out.k.tobytes() == snap.k.tobytes() and out.v.tobytes() == snap.v.tobytes()
    assert out.tokens == TOKENS and all(type(t) is int for t in out.tokens)


def test_empty_kv_dimensions_round_trip():
    layout = replace(LAYOUT, n_layer=0)
    out = decode(encode(snapshot(layout)), layout)
    assert out.k.shape == (0, 2, len(TOKENS), 8) and out.tokens == TOKENS


def test_read_header_skips_the_model_comparison(blob):
    header = read_header(blob)
    assert header["architecture"] == "llama" and header["weights_version"] == LAYOUT.weights_version
    assert (header["n_layer"], header["n_kv_head"], header["head_dim"]) == (3, 2, 8)
    assert header["n_tok"] == len(TOKENS) and header["tokens"] == list(TOKENS)
    assert header["session_id"] == "chat-42" and header["created"] == 1_700_000_000.25
    other = encode(snapshot(KVLayout("gemma3", "ffff", 1, 1, 4)))
    assert read_header(other)["architecture"] == "gemma3"


def test_read_header_refuses_what_decode_refuses(blob):
    with pytest.raises(BadSessionBlob, match="checksum"):
        read_header(blob[:-40] + bytes([blob[-40] ^ 1]) + blob[-39:])
    with pytest.raises(BadSessionBlob, match="truncated"):
        read_header(blob[:100])
    with pytest.raises(BadSessionBlob, match="tokens"):
        read_header(rebuilt(blob, tokens=[1, 2]))


def test_unknown_header_keys_are_ignored(blob):
    assert decode(rebuilt(blob, note="from a later writer"), LAYOUT).tokens == TOKENS


# --- structure, length, checksum -------------------------------------------------------


@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")])
def test_empty_input(empty):
    refused(empty, "empty")
    with pytest.raises(BadSessionBlob):
        read_header(empty)


@pytest.mark.parametrize(
    "data", [b"GGUF\x03\x00\x00\x00" + bytes(64), b"{}", b"PNKVBLOX" + bytes(40)]
)
def test_wrong_magic(data):
    refused(data, "not a session blob", "PNKVBLOB")


@pytest.mark.parametrize("version", [0, 2, 0xFFFFFFFF])
def test_unsupported_version(blob, version):
    data = build(parts(blob)[0], parts(blob)[1], version=version)
    refused(data, f"version {version}", "reads version 1")


@pytest.mark.parametrize("header_len", [(64 << 20) + 1, 0xFFFFFFFF])
def test_huge_header_length_is_refused_before_reading(header_len):
    data = MAGIC + struct.pack("<II", 1, header_len) + b"{}" + bytes(32)
    refused(data, str(header_len), "64 MiB")


def test_a_header_length_at_the_limit_is_only_truncated():
    refused(MAGIC + struct.pack("<II", 1, 64 << 20) + b"{}", "truncated")


def test_truncated_at_every_interesting_point(blob):
    header_len = struct.unpack_from("<I", blob, 12)[0]
    payload = (len(blob) - 16 - header_len - 32) // 2
    cuts = [
        1,
        5,
        8,
        12,
        15,
        16,
        16 + header_len // 2,  # inside the header
        16 + header_len,  # header complete, no payload
        16 + header_len + payload // 2,  # inside K
        16 + header_len + payload + 3,  # inside V
        len(blob) - 32,  # no checksum at all
        len(blob) - 17,  # inside the checksum
        len(blob) - 1,
    ]
    for cut in cuts:
        message = refused(blob[:cut], "truncated", f"got {cut}")
        if cut >= 16 + header_len:
            assert f"expected {len(blob)} bytes" in message


@pytest.mark.parametrize("extra", [b"\x00", b"garbage", bytes(32)])
def test_trailing_bytes(blob, extra):
    refused(
        blob + extra, "trailing", f"expected {len(blob)} bytes", f"got {len(blob) + len(extra)}"
    )


@pytest.mark.parametrize("where", ["header", "k", "v", "checksum"])
def test_a_flipped_bit_is_a_checksum_failure(blob, where):
    header_len = struct.unpack_from("<I", blob, 12)[0]
    payload = (len(blob) - 16 - header_len - 32) // 2
    at = {
        "header": blob.index(b"chat-42") + 2,  # still valid JSON, still a string
        "k": 16 + header_len + 5,
        "v": 16 + header_len + payload + payload // 2,
        "checksum": len(blob) - 1,
    }[where]
    data = bytearray(blob)
    data[at] ^= 0x04
    refused(bytes(data), "checksum does not match (corrupt)")


def test_corruption_is_reported_before_a_model_mismatch():
    data = bytearray(encode(snapshot(KVLayout("gemma3", "other", 1, 1, 4))))
    data[-40] ^= 1
    refused(bytes(data), "checksum")


# --- header content --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'{"a": 1} x', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"created": NaN}', "not valid JSON"),
        (b'{"a": 1, "a": 2}', "duplicate key"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b"[1, 2, 3]", "JSON object, found a list"),
        (b'"llama"', "JSON object, found a string"),
        (b"null", "JSON object, found null"),
    ],
)
def test_header_that_is_not_a_json_object(raw, needle):
    refused(build(raw, b""), needle)


@pytest.mark.parametrize(
    "key",
    [
        "architecture",
        "weights_version",
        "kv_dtype",
        "n_layer",
        "n_kv_head",
        "head_dim",
        "n_tok",
        "tokens",
        "session_id",
        "created",
    ],
)
def test_missing_header_field(blob, key):
    refused(rebuilt(blob, **{key: None}), f"no '{key}' field")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("architecture", 7, "'architecture' must be a string, found an integer"),
        ("weights_version", ["x"], "'weights_version' must be a string, found a list"),
        ("kv_dtype", "bfloat16", "KV dtype is 'bfloat16'"),
        ("kv_dtype", 4, "KV dtype is 4"),
        ("n_layer", "3", "'n_layer' must be an integer >= 0, found '3'"),
        ("n_layer", 3.0, "'n_layer' must be an integer"),
        ("n_kv_head", True, "'n_kv_head' must be an integer"),
        ("head_dim", -8, "'head_dim' must be an integer >= 0, found -8"),
        ("n_tok", 0, "'n_tok' must be an integer >= 1, found 0"),
        ("tokens", {"0": 1}, "'tokens' must be a list, found an object"),
        ("tokens", "1 2 3", "'tokens' must be a list"),
        ("session_id", 42, "'session_id' must be a string or null, found an integer"),
        ("created", "yesterday", "'created' must be a number, found a string"),
        ("created", False, "'created' must be a number, found a boolean"),
        ("created", 10**400, "'created' must be finite"),
    ],
)
def test_header_field_of_the_wrong_type(blob, key, value, needle):
    refused(rebuilt(blob, **{key: value}), needle)


def test_an_integer_created_time_is_accepted(blob):
    assert decode(rebuilt(blob, created=1_700_000_000), LAYOUT).created == 1_700_000_000.0


# --- comparison with the model ---------------------------------------------------------


def test_other_architecture(blob):
    refused(
        blob,
        "blob is for architecture 'llama', this model is 'qwen3'",
        layout=replace(LAYOUT, architecture="qwen3"),
    )


def test_other_architecture_wins_over_other_shape_and_weights(blob):
    other = KVLayout("gemma3", "0000", n_layer=9, n_kv_head=9, head_dim=9)
    refused(blob, "architecture", layout=other)


@pytest.mark.parametrize(
    "change", [{"n_layer": 4}, {"n_kv_head": 1}, {"head_dim": 16}, {"n_layer": 0}]
)
def test_other_kv_shape(blob, change):
    model = replace(LAYOUT, **change)
    want = f"({model.n_layer} layers, {model.n_kv_head} kv heads, head dim {model.head_dim})"
    refused(
        blob,
        "blob KV shape (3 layers, 2 kv heads, head dim 8) does not fit this model",
        want,
        layout=model,
    )


def test_other_shape_wins_over_other_weights(blob):
    refused(blob, "does not fit", layout=replace(LAYOUT, head_dim=4, weights_version="ffff"))


def test_same_shape_other_weights(blob):
    model = replace(LAYOUT, weights_version="fedcba9876543210")
    with pytest.raises(WeightsVersionMismatch) as info:
        decode(blob, model)
    message = str(info.value)
    assert "abcdef0123456789" in message and "fedcba9876543210" in message
    assert "replay the conversation" in message
    assert not isinstance(info.value, BadSessionBlob)


@pytest.mark.parametrize(
    ("tokens", "needle"),
    [
        (list(TOKENS[:-1]), f"lists {len(TOKENS) - 1} tokens but its KV holds n_tok=7"),
        (list(TOKENS) + [5], f"lists {len(TOKENS) + 1} tokens"),
        ([1, 2, 3, 4, 5, 6, 2**31], "token 6 is 2147483648"),
        ([1, 2, -1, 4, 5, 6, 7], "token 2 is -1"),
        ([1, 2, 3, 4.5, 5, 6, 7], "token 3 is 4.5"),
        ([1, "2", 3, 4, 5, 6, 7], "token 1 is '2'"),
        ([True, 2, 3, 4, 5, 6, 7], "token 0 is True"),
    ],
)
def test_bad_tokens(blob, tokens, needle):
    refused(rebuilt(blob, tokens=tokens), needle)


def test_bad_tokens_win_over_other_weights(blob):
    refused(rebuilt(blob, tokens=[1]), "tokens", layout=replace(LAYOUT, weights_version="x"))


def test_messages_quote_attacker_strings_briefly(blob):
    message = refused(rebuilt(blob, architecture="x" * 10_000), "architecture")
    assert len(message) < 300


# --- encode ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda s: replace(s, k=s.k[:, :, :-1]), "snapshot.k has shape"),
        (lambda s: replace(s, v=s.v[:2]), "snapshot.v has shape"),
        (lambda s: replace(s, v=s.v.reshape(3, 2, 8, 7)), "snapshot.v has shape"),
        (lambda s: replace(s, k=s.k.astype(np.float64)), "float32"),
        (lambda s: replace(s, v=s.v.astype(np.float16)), "float32"),
        (lambda s: replace(s, k=s.k.tolist()), "numpy array"),
        (lambda s: replace(s, tokens=s.tokens[:-1]), "snapshot.k has shape"),
        (lambda s: replace(s, layout=replace(LAYOUT, head_dim=4)), "has shape"),
        (lambda s: replace(s, tokens=()), "no tokens"),
        (lambda s: replace(s, tokens=(1, 2, 3, 4, 5, 6, -1)), "tokens[6]"),
        (lambda s: replace(s, tokens=(1, 2, 3, 4, 5, 6, 2**31)), "tokens[6]"),
        (lambda s: replace(s, layout=replace(LAYOUT, n_layer=-1)), "n_layer"),
        (lambda s: replace(s, layout=replace(LAYOUT, architecture=None)), "architecture"),
        (lambda s: replace(s, session_id=42), "session_id"),
        (lambda s: replace(s, created=float("nan")), "created"),
    ],
)
def test_encode_refuses_an_inconsistent_snapshot(change, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        encode(change(snapshot()))


def test_the_module_stands_alone_without_django():
    probe = (
        "import sys, engine.serving.session_blob, engine.serving.session_blob_read\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'django')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_disk_writer_writes_a_blobs_parts_without_a_joined_copy(tmp_path):
    """encode_parts gives the blob as views of K and V, and write_atomic writes them in
    turn: the file is the joined blob, and writing it holds no second copy of the KV."""
    layout = replace(LAYOUT, n_layer=8, n_kv_head=4, head_dim=64)
    snap = snapshot(layout, tokens=tuple(range(2000)))  # K and V: 16 MB each
    kv_bytes = snap.k.nbytes + snap.v.nbytes
    path = tmp_path / "one.blob"
    peak = _peak_writing(path, snap)
    assert path.read_bytes() == encode(snap)
    assert peak < kv_bytes // 8, (peak, kv_bytes)  # joined, it was the whole blob


def _peak_writing(path, snap) -> int:
    """write_atomic of snap's parts to path: the peak of Python's allocations meanwhile."""
    tracemalloc.start()
    try:
        write_atomic(path, encode_parts(snap))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_kv_padded_after_each_layer_and_head_is_written_as_it_is(tmp_path):
    """A conversation moved out of its slot by its pages (KVCache.take) holds K and V as
    views padded after each (layer, head) run: the blob is byte for byte the contiguous
    one's, written from the runs without a copy."""
    layout = replace(LAYOUT, n_layer=8, n_kv_head=4, head_dim=64)
    snap = snapshot(layout, tokens=tuple(range(2000)))

    def padded(arr):
        room = np.zeros((*arr.shape[:2], arr.shape[2] + 48, arr.shape[3]), arr.dtype)
        room[:, :, : arr.shape[2]] = arr
        return room[:, :, : arr.shape[2]]

    moved = replace(snap, k=padded(snap.k), v=padded(snap.v))
    assert not moved.k.flags.c_contiguous
    path = tmp_path / "moved.blob"
    peak = _peak_writing(path, moved)
    assert path.read_bytes() == encode(snap)
    assert peak < (snap.k.nbytes + snap.v.nbytes) // 8, peak


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "q8_0"])
def test_a_conversation_taken_from_its_slot_writes_the_blob_a_copy_writes(kv_dtype):
    """KVCache.take's arrays (pages moved, each run padded) of every KV type: the blob is
    byte for byte the one of `save`'s copy, and reads back as the slot held it."""
    from kernels.kv_cache import KVCache

    kv = KVCache(3, 2, 2, 4096, 64, kv_dtype=kv_dtype)
    n, rng = 2000, np.random.default_rng(1)
    for layer in range(3):
        rows = rng.standard_normal((2, 2, n, 64)).astype(np.float32)
        kv.write(layer, 1, 0, rows[0], rows[1])
    saved = kv.save(1, n)
    k, v = kv.take(1, n, 0)
    layout = replace(LAYOUT, n_layer=3, n_kv_head=2, head_dim=64, kv_dtype=kv_dtype)
    taken = replace(snapshot(layout, tokens=tuple(range(n))), k=k, v=v)
    blob = encode(taken)
    assert blob == encode(replace(taken, k=saved[0], v=saved[1]))
    back = decode(blob, layout)
    assert np.array_equal(back.k, saved[0]) and np.array_equal(back.v, saved[1])
