"""Large JSON answers encoded in slices, so other threads get the GIL meanwhile.

`json.dumps` is C code that holds the GIL from start to end: the ids of a 2 MB /tokenize
text (~480k ints) take ~55 ms, 256 embeddings of 576 floats ~115 ms, and for that long
the engine thread cannot run the Python between its kernels, nor the event loop stream a
token to anyone. A flood of such requests from one key then slowed every other key's
first token about threefold (tests/e2e/test_fair_flood.py). Here a long list is encoded
a slice at a time: between two slices the interpreter honours another thread's request
for the GIL (after `sys.getswitchinterval()`, 5 ms), so nobody waits longer than that
plus one slice. The bytes are exactly `json.dumps`'s with the same options (JSON's
encoding of a list is the encoding of its items joined by the separator).
"""

from __future__ import annotations

import json

import numpy as np
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse

# Items encoded per call: about a millisecond of encoding each.
SCALAR_SLICE = 4096  # ints, floats, strings
CONTAINER_SLICE = 4  # lists or objects (an embedding's 576 floats is ~0.4 ms)


def _encoder() -> json.JSONEncoder:
    # As django.http.JsonResponse with pantheon_platform.errors.json_response's options.
    return DjangoJSONEncoder(separators=(",", ":"))


def dumps_in_slices(value: object) -> str:
    """`json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":"))`, encoded a
    slice of each long list at a time."""
    parts: list[str] = []
    _encode(value, _encoder(), parts)
    return "".join(parts)


def _encode(value: object, encoder: json.JSONEncoder, parts: list[str]) -> None:
    if isinstance(value, dict):
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                parts.append(",")
            # The key and its colon as json.dumps writes them (a non-str key converted
            # as it converts one): '{"key":null}' less its '{' and 'null}'.
            parts.append(encoder.encode({key: None})[1:-5])
            _encode(item, encoder, parts)
        parts.append("}")
    elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        # A 1-D integer array (token ids), as json.dumps writes the list of its ints;
        # only a slice's ints exist as Python objects at a time.
        parts.append("[")
        for start in range(0, len(value), SCALAR_SLICE):
            if start:
                parts.append(",")
            parts.append(encoder.encode(value[start : start + SCALAR_SLICE].tolist())[1:-1])
        parts.append("]")
    elif isinstance(value, list | tuple) and len(value) > CONTAINER_SLICE:
        containers = any(isinstance(item, dict | list | tuple) for item in value[:8])
        step = CONTAINER_SLICE if containers else SCALAR_SLICE
        parts.append("[")
        for start in range(0, len(value), step):
            if start:
                parts.append(",")
            chunk = value[start : start + step]
            if containers:
                for j, item in enumerate(chunk):
                    if j:
                        parts.append(",")
                    _encode(item, encoder, parts)
            else:
                parts.append(encoder.encode(list(chunk))[1:-1])
        parts.append("]")
    else:
        parts.append(encoder.encode(value))


def sliced_json_response(body: dict, status: int = 200) -> HttpResponse:
    """json_response's answer (the same bytes and headers), for bodies that may be large."""
    return HttpResponse(
        dumps_in_slices(body).encode(), status=status, content_type="application/json"
    )
