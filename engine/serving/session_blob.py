"""Session blobs: the portable, versioned, self-describing binary form of a conversation's
KV-cache state. Used by ``POST /admin/session/export`` / ``POST /session/restore`` (as
base64) and for spilling sessions to disk at shutdown.

Format, version 1
=================

All integers and floats are little-endian. ``H`` is the header length, ``P`` the size in
bytes of one KV payload (``n_layer * n_kv_head * n_tok * R``, ``R`` the bytes of one
position of one head in the blob's KV type: ``head_dim * 4`` for "float32", ``head_dim *
2`` for "float16", ``head_dim / 32 * 34`` for "q8_0")::

    offset      size      field
    0           8         magic b"PNKVBLOB"
    8           4         u32 format version (FORMAT_VERSION = 1)
    12          4         u32 header length H in bytes; a reader refuses H > 64 MiB
    16          H         header: a UTF-8 JSON object (below)
    16+H        P         K: C order, (n_layer, n_kv_head, n_tok) rows of R bytes: float32
                          or float16 values, or Q8_0 blocks (an f16 scale, 32 int8 values)
    16+H+P      P         V: same type, shape and order
    16+H+2P     32        sha256 of bytes [0, 16+H+2P), i.e. of every preceding byte

The total length is exactly ``16 + H + 2*P + 32``; anything shorter is truncated, anything
longer carries trailing bytes, and both are refused.

Header keys (all required; unknown keys are ignored so a later writer may add
informative ones without a version bump):

    "architecture"     str    GGUF ``general.architecture`` of the model, e.g. "llama"
    "weights_version"  str    the model's weights version (content hash of its GGUF)
    "kv_dtype"         str    "float32", "float16" or "q8_0": the model's KV cache type (its
                              `kv_dtype` load option f32, f16, q8_0; version 1 first defined
                              only "float32", which every earlier blob holds)
    "n_layer"          int    >= 0
    "n_kv_head"        int    >= 0
    "head_dim"         int    >= 0
    "n_tok"            int    >= 1, the number of cached positions
    "tokens"           list   exactly n_tok ints t with 0 <= t < 2**31: the token ids the
                              cache covers, in order
    "session_id"       str or null   informative only (restore names its own session)
    "created"          number        unix time of the capture (finite)

One optional key (a compatible extension of version 1: a blob without it is read as
before, and a reader that predates it ignores it):

    "namespace"        str or null   whose session it was (the API key's namespace, see
                                     serving/sessions.py); absent or null: "open". An
                                     HTTP restore installs under the caller's own
                                     namespace whatever this says; a spill file restored
                                     at start goes back to the namespace it names.

JSON booleans are not integers here; NaN/Infinity literals and duplicate keys are refused.
The writer in this module emits compact ASCII JSON and pads it with trailing spaces (still
valid JSON) so that K starts at a multiple of 64 bytes from the start of the blob; readers
must not rely on the padding.

The checksum detects corruption and truncation, not tampering: anyone can build a valid
blob. A restore must still check what the model needs beyond this module's checks (token
ids below the vocabulary size, n_tok within the context window).

The reader (validation order, decode, read_header) is session_blob_read.py.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

import numpy as np

from kernels import kv_types

MAGIC = b"PNKVBLOB"
FORMAT_VERSION = 1
MAX_HEADER_BYTES = 64 << 20  # 64 MiB
KV_DTYPE = "float32"  # what a model with the default f32 cache writes
# The blob's name for each KV type (the `kv_dtype` load option's values) and its element.
BLOB_KV_DTYPES = {"f32": "float32", "f16": "float16", "q8_0": "q8_0"}
_KV_OF_BLOB = {name: kv for kv, name in BLOB_KV_DTYPES.items()}
_ELEMENT = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "q8_0": np.dtype("u1")}
TOKEN_LIMIT = 1 << 31  # token ids are 0 <= t < 2**31

_PREAMBLE = struct.Struct("<8sII")  # magic, format version, header length
_DIGEST_BYTES = 32
_PAYLOAD_ALIGN = 64
_SIZE_FIELDS = ("n_layer", "n_kv_head", "head_dim", "n_tok")
_HEADER_KEYS = (
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
)


@dataclass(frozen=True)
class KVLayout:
    """What a model's KV cache looks like; a blob must match it to be restored."""

    architecture: str
    weights_version: str
    n_layer: int
    n_kv_head: int
    head_dim: int
    kv_dtype: str = "f32"  # the cache's type (kernels/kv_types.py): f32, f16 or q8_0

    @property
    def row_items(self) -> int:
        """Elements of one position of one head as stored (head_dim, or Q8_0 bytes)."""
        return kv_types.storage(self.kv_dtype, self.head_dim)[1]


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no truth value; compare fields
class SessionSnapshot:
    """One conversation's cached state: the tokens and their K/V, each
    (n_layer, n_kv_head, n_tok, row) in the layout's KV type (row: head_dim float32 or
    float16 values, or head_dim / 32 Q8_0 blocks as bytes)."""

    layout: KVLayout
    tokens: tuple[int, ...]
    k: np.ndarray
    v: np.ndarray
    session_id: str | None = None
    created: float = 0.0
    namespace: str | None = None

    @property
    def n_tok(self) -> int:
        return len(self.tokens)


# --- encode ----------------------------------------------------------------------------


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _payload(name: str, arr: object, shape: tuple[int, ...], element: np.dtype) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"snapshot.{name} must be a numpy array, got {type(arr).__name__}")
    if arr.dtype.kind != element.kind or arr.dtype.itemsize != element.itemsize:
        raise ValueError(f"snapshot.{name} must be {element}, got {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(
            f"snapshot.{name} has shape {arr.shape}; the layout and tokens need {shape} "
            "(n_layer, n_kv_head, n_tok, row)"
        )
    # Little-endian; a copy only when the array is not already that and C-contiguous per
    # (layer, head) (a slot's KV moved out by its pages is padded after each: KVCache.take).
    if arr.dtype != element or not all(
        arr[i, j].flags.c_contiguous for i, j in np.ndindex(shape[:2])
    ):
        return np.ascontiguousarray(arr, dtype=element)
    return arr


def _raw_bytes(arr: np.ndarray) -> list[memoryview]:
    """The payload's bytes in order: one view of a C-contiguous array, else one per
    (layer, head) run."""
    if arr.flags.c_contiguous:
        return [memoryview(arr.reshape(-1).view(np.uint8))]
    return [memoryview(arr[i, j].reshape(-1).view(np.uint8)) for i, j in np.ndindex(arr.shape[:2])]


def encode(snapshot: SessionSnapshot) -> bytes:
    """The blob for `snapshot` (format above), joined once from `encode_parts`."""
    return b"".join(encode_parts(snapshot))


def encode_parts(snapshot: SessionSnapshot) -> list[bytes | memoryview]:
    """The blob for `snapshot` as consecutive parts: the preamble and header, views of K
    and V, the digest. A writer that writes them in turn never holds a second copy of
    the KV (the disk writer: a 1.9k-token SmolLM2 conversation is 84 MB).

    Raises ValueError when the snapshot is inconsistent (a programming error): layout
    fields of the wrong type or negative, no tokens or a token out of range, K/V not
    float32 or not of shape (n_layer, n_kv_head, len(tokens), head_dim).

    Memory: K/V are copied only if they are not already little-endian and C-contiguous
    per (layer, head) run; the digest is computed over the parts in place.
    """
    layout = snapshot.layout
    if not isinstance(layout, KVLayout):
        raise ValueError(f"snapshot.layout must be a KVLayout, got {type(layout).__name__}")
    for name in ("architecture", "weights_version"):
        if not isinstance(getattr(layout, name), str):
            raise ValueError(f"layout.{name} must be a str")
    for name in ("n_layer", "n_kv_head", "head_dim"):
        value = getattr(layout, name)
        if not is_int(value) or value < 0:
            raise ValueError(f"layout.{name} must be an int >= 0, got {value!r}")
    tokens = [int(t) if isinstance(t, np.integer) else t for t in snapshot.tokens]
    if not tokens:
        raise ValueError("snapshot has no tokens; a blob holds at least one")
    for i, t in enumerate(tokens):
        if not is_int(t) or not 0 <= t < TOKEN_LIMIT:
            raise ValueError(f"snapshot.tokens[{i}] = {t!r} is not an int in [0, 2**31)")
    if snapshot.session_id is not None and not isinstance(snapshot.session_id, str):
        raise ValueError("snapshot.session_id must be a str or None")
    if snapshot.namespace is not None and not isinstance(snapshot.namespace, str):
        raise ValueError("snapshot.namespace must be a str or None")
    created = snapshot.created
    if isinstance(created, bool) or not isinstance(created, int | float | np.floating):
        raise ValueError(f"snapshot.created must be a number, got {created!r}")
    created = float(created)
    if not np.isfinite(created):
        raise ValueError(f"snapshot.created must be finite, got {created!r}")

    if layout.kv_dtype not in BLOB_KV_DTYPES:
        raise ValueError(f"layout.kv_dtype must be one of {', '.join(BLOB_KV_DTYPES)}")
    if kv_types.fits(layout.kv_dtype, layout.head_dim):
        raise ValueError(kv_types.fits(layout.kv_dtype, layout.head_dim))
    shape = (layout.n_layer, layout.n_kv_head, len(tokens), layout.row_items)
    k = _payload("k", snapshot.k, shape, _ELEMENT[layout.kv_dtype])
    v = _payload("v", snapshot.v, shape, _ELEMENT[layout.kv_dtype])

    header = {
        "architecture": layout.architecture,
        "weights_version": layout.weights_version,
        "kv_dtype": BLOB_KV_DTYPES[layout.kv_dtype],
        "n_layer": layout.n_layer,
        "n_kv_head": layout.n_kv_head,
        "head_dim": layout.head_dim,
        "n_tok": len(tokens),
        "tokens": tokens,
        # str(): a SessionKey (a str subclass) is written as its bare id.
        "session_id": None if snapshot.session_id is None else str(snapshot.session_id),
        "created": created,
    }
    if snapshot.namespace is not None:
        header["namespace"] = snapshot.namespace
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    header_bytes = text.encode("ascii")
    header_bytes += b" " * (-(_PREAMBLE.size + len(header_bytes)) % _PAYLOAD_ALIGN)
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise ValueError(
            f"blob header would be {len(header_bytes)} bytes, over the {MAX_HEADER_BYTES} "
            "byte limit readers enforce"
        )

    parts: list[bytes | memoryview] = [
        _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header_bytes)),
        header_bytes,
        *_raw_bytes(k),
        *_raw_bytes(v),
    ]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    parts.append(digest.digest())
    return parts
