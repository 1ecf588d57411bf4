"""Reading session blobs (the format: session_blob.py): `decode` against a model's
layout, `read_header` without one.

Validation order of :func:`decode` (the HTTP contract depends on it: a blob that is broken
or does not fit is ``400 bad_session_blob``; only a blob that is intact and fits the model
but was captured under other weights is ``409 weights_version_mismatch``):

1. structure: empty input, magic, format version, header length limit, the header's bytes
   all present, header is UTF-8 JSON and an object;
2. size: the fields the payload size depends on ("kv_dtype" one of the three; "n_layer",
   "n_kv_head", "head_dim", "n_tok" present and non-negative ints, n_tok >= 1, head_dim a
   multiple of 32 for "q8_0"), then the total length is exact (truncated / trailing bytes);
3. checksum;
4. the remaining header field types;
5. architecture (vs the model);
6. KV shape: n_layer, n_kv_head, head_dim, then the KV type (vs the model's: a blob
   restores only into a model that keeps its cache in the same type);
7. tokens: count == n_tok, each an int in range;
8. weights_version (vs the model) -> :class:`WeightsVersionMismatch`.

Every other failure raises :class:`BadSessionBlob`. :func:`read_header` runs steps 1-4 and
7 (everything not compared with a model).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from kernels import kv_types

from ..types import BadSessionBlob, WeightsVersionMismatch
from .session_blob import (
    _DIGEST_BYTES,
    _ELEMENT,
    _HEADER_KEYS,
    _KV_OF_BLOB,
    _PREAMBLE,
    _SIZE_FIELDS,
    BLOB_KV_DTYPES,
    FORMAT_VERSION,
    MAGIC,
    MAX_HEADER_BYTES,
    TOKEN_LIMIT,
    KVLayout,
    SessionSnapshot,
    is_int,
)


def _show(value: object, limit: int = 80) -> str:
    """A header value quoted for an error message, shortened if an attacker made it long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _kind(value: object) -> str:
    """What a JSON value is, with its article, for an error message."""
    return _KINDS.get(type(value), type(value).__name__)


def _as_bytes_view(blob: bytes | bytearray | memoryview) -> memoryview:
    mv = memoryview(blob)
    if not mv.c_contiguous:
        raise TypeError("session blob buffer must be contiguous")
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    return mv


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _missing(header: dict, key: str) -> None:
    if key not in header:
        raise BadSessionBlob(f"blob header has no {key!r} field")


def _parse(mv: memoryview) -> tuple[dict, int]:
    """Steps 1-4 of the validation order; returns the header and the offset of K."""
    n = len(mv)
    if n == 0:
        raise BadSessionBlob("session blob is empty")
    head = bytes(mv[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise BadSessionBlob(
            f"not a session blob: expected magic {MAGIC!r}, found {_show(head)} at the start"
        )
    if n < _PREAMBLE.size:
        raise BadSessionBlob(
            f"blob is truncated: expected at least {_PREAMBLE.size} bytes "
            f"(magic, version, header length), got {n}"
        )
    _, version, header_len = _PREAMBLE.unpack_from(mv, 0)
    if version != FORMAT_VERSION:
        raise BadSessionBlob(
            f"unsupported session blob format version {version}; "
            f"this server reads version {FORMAT_VERSION}"
        )
    if header_len > MAX_HEADER_BYTES:
        raise BadSessionBlob(
            f"blob header length {header_len} bytes exceeds the limit of "
            f"{MAX_HEADER_BYTES} bytes (64 MiB)"
        )
    k_offset = _PREAMBLE.size + header_len
    if n < k_offset:
        raise BadSessionBlob(
            f"blob is truncated: expected at least {k_offset + _DIGEST_BYTES} bytes "
            f"(its header alone is {header_len} bytes), got {n}"
        )
    try:
        text = bytes(mv[_PREAMBLE.size : k_offset]).decode("utf-8")
        header = json.loads(
            text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys
        )
    except UnicodeDecodeError as e:
        raise BadSessionBlob(f"blob header is not UTF-8: {e.reason} at byte {e.start}") from e
    except (ValueError, RecursionError) as e:
        raise BadSessionBlob(f"blob header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise BadSessionBlob(f"blob header must be a JSON object, found {_kind(header)}")

    # Size: what the payload length depends on.
    _missing(header, "kv_dtype")
    kv_dtype = _KV_OF_BLOB.get(header["kv_dtype"]) if isinstance(header["kv_dtype"], str) else None
    if kv_dtype is None:
        raise BadSessionBlob(
            f"blob KV dtype is {_show(header['kv_dtype'])}; format version "
            f"{FORMAT_VERSION} holds {', '.join(repr(n) for n in BLOB_KV_DTYPES.values())}"
        )
    for key in _SIZE_FIELDS:
        _missing(header, key)
        value = header[key]
        least = 1 if key == "n_tok" else 0
        if not is_int(value) or value < least:
            raise BadSessionBlob(
                f"blob header field {key!r} must be an integer >= {least}, found {_show(value)}"
            )
    problem = kv_types.fits(kv_dtype, header["head_dim"])
    if problem:
        raise BadSessionBlob(f"blob: {problem}")
    row = kv_types.row_bytes(kv_dtype, header["head_dim"])
    payload = header["n_layer"] * header["n_kv_head"] * header["n_tok"] * row
    expected = k_offset + 2 * payload + _DIGEST_BYTES
    if n < expected:
        raise BadSessionBlob(f"blob is truncated: expected {expected} bytes, got {n}")
    if n > expected:
        raise BadSessionBlob(
            f"blob has {n - expected} trailing bytes after its checksum: "
            f"expected {expected} bytes, got {n}"
        )

    if hashlib.sha256(mv[: n - _DIGEST_BYTES]).digest() != bytes(mv[n - _DIGEST_BYTES :]):
        raise BadSessionBlob("blob checksum does not match (corrupt)")

    # The remaining field types.
    for key in ("architecture", "weights_version"):
        _missing(header, key)
        if not isinstance(header[key], str):
            raise BadSessionBlob(
                f"blob header field {key!r} must be a string, found {_kind(header[key])}"
            )
    _missing(header, "tokens")
    if not isinstance(header["tokens"], list):
        raise BadSessionBlob(
            f"blob header field 'tokens' must be a list, found {_kind(header['tokens'])}"
        )
    _missing(header, "session_id")
    if header["session_id"] is not None and not isinstance(header["session_id"], str):
        raise BadSessionBlob(
            "blob header field 'session_id' must be a string or null, "
            f"found {_kind(header['session_id'])}"
        )
    namespace = header.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise BadSessionBlob(
            f"blob header field 'namespace' must be a string or null, found {_kind(namespace)}"
        )
    _missing(header, "created")
    created = header["created"]
    if isinstance(created, bool) or not isinstance(created, int | float):
        raise BadSessionBlob(
            f"blob header field 'created' must be a number, found {_kind(created)}"
        )
    try:
        finite = bool(np.isfinite(float(created)))
    except OverflowError:
        finite = False
    if not finite:
        raise BadSessionBlob(f"blob header field 'created' must be finite, found {created}")
    return header, k_offset


def _check_tokens(header: dict) -> None:
    tokens, n_tok = header["tokens"], header["n_tok"]
    if len(tokens) != n_tok:
        raise BadSessionBlob(
            f"blob header lists {len(tokens)} tokens but its KV holds n_tok={n_tok} positions"
        )
    for i, t in enumerate(tokens):
        if not is_int(t) or not 0 <= t < TOKEN_LIMIT:
            raise BadSessionBlob(f"blob token {i} is {_show(t)}; expected an integer in [0, 2**31)")


def _clean_header(header: dict) -> dict:
    out = {key: header[key] for key in _HEADER_KEYS}
    out["namespace"] = header.get("namespace")  # optional: None in a blob without it
    out["created"] = float(out["created"])
    return out


def read_header(blob: bytes | bytearray | memoryview) -> dict:
    """The validated header of a blob, with no model comparison (for listing spilled
    sessions): magic, version, lengths, checksum, field types and tokens are checked.

    Returns a new dict with exactly the documented header keys ("created" as a float,
    "namespace" None when the blob has none).
    Raises BadSessionBlob.
    """
    header, _ = _parse(_as_bytes_view(blob))
    _check_tokens(header)
    return _clean_header(header)


def decode(blob: bytes | bytearray | memoryview, expect: KVLayout) -> SessionSnapshot:
    """The snapshot in `blob`, checked against the model layout `expect` in the order the
    module docstring lists. Raises BadSessionBlob, or WeightsVersionMismatch when the
    blob is intact and fits the model but was captured under other weights.

    Nothing is returned before everything is validated. The returned ``k`` and ``v`` are
    read-only ``np.frombuffer`` views into `blob` (no copy; they may be unaligned): they
    keep `blob` alive, see any later change to a mutable `blob` (a bytearray cannot be
    resized while they exist), and must be copied by a caller that needs its own arrays.
    """
    mv = _as_bytes_view(blob)
    header, k_offset = _parse(mv)

    if header["architecture"] != expect.architecture:
        raise BadSessionBlob(
            f"blob is for architecture {_show(header['architecture'])}, "
            f"this model is {expect.architecture!r}"
        )
    got = (header["n_layer"], header["n_kv_head"], header["head_dim"])
    want = (expect.n_layer, expect.n_kv_head, expect.head_dim)
    if got != want:
        raise BadSessionBlob(
            "blob KV shape ({} layers, {} kv heads, head dim {}) does not fit this model "
            "({} layers, {} kv heads, head dim {})".format(*got, *want)
        )
    kv_dtype = _KV_OF_BLOB[header["kv_dtype"]]
    if kv_dtype != expect.kv_dtype:
        raise BadSessionBlob(
            f"blob KV cache type is {kv_dtype}; this model keeps its KV cache as "
            f"{expect.kv_dtype} (its kv_dtype load option): a blob restores only into a "
            "model of the same KV type — replay the conversation instead"
        )
    _check_tokens(header)
    if header["weights_version"] != expect.weights_version:
        raise WeightsVersionMismatch(
            f"blob was captured under weights {_show(header['weights_version'])}; "
            f"this model serves {expect.weights_version!r} — replay the conversation instead"
        )

    n_tok = header["n_tok"]
    shape = (expect.n_layer, expect.n_kv_head, n_tok, expect.row_items)
    count = expect.n_layer * expect.n_kv_head * n_tok * expect.row_items
    element = _ELEMENT[kv_dtype]
    arrays = []
    for offset in (k_offset, k_offset + count * element.itemsize):
        arr = np.frombuffer(mv, dtype=element, count=count, offset=offset).reshape(shape)
        arr.flags.writeable = False
        arrays.append(arr)
    return SessionSnapshot(
        layout=KVLayout(
            architecture=header["architecture"],
            weights_version=header["weights_version"],
            n_layer=header["n_layer"],
            n_kv_head=header["n_kv_head"],
            head_dim=header["head_dim"],
            kv_dtype=kv_dtype,
        ),
        tokens=tuple(header["tokens"]),
        k=arrays[0],
        v=arrays[1],
        session_id=header["session_id"],
        created=float(header["created"]),
        namespace=header.get("namespace"),
    )
