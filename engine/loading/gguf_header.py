"""A GGUF header (metadata and tensor index) read in one pass over the file's bytes.

gguf-py's GGUFReader builds a numpy view per field part: on a 262k-token vocabulary that
is millions of memmap objects and ~15 s. This reads the same values with `struct` and
`np.frombuffer` (whole numeric arrays at once), which is what makes a first load of a
file take the time of reading its header, not of wrapping it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types: struct format of the scalars, numpy dtype for arrays of them.
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_MAX_DIMS = 8


class HeaderError(ValueError):
    """The bytes are not a well-formed GGUF header."""


@dataclass(frozen=True)
class TensorEntry:
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: ne[0] first
    offset: int  # absolute, in the file
    nbytes: int


class _Cursor:
    def __init__(self, data: memoryview):
        self.data = data
        self.pos = 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise HeaderError("the header runs past the end of the file")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise HeaderError("the header runs past the end of the file")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def string(self) -> str:
        return str(self.raw(self.take("<Q")), "utf-8")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, count = self.take("<I"), self.take("<Q")
            if itype in _SCALARS:
                dtype = np.dtype(_SCALARS[itype])
                values = np.frombuffer(self.raw(count * dtype.itemsize), dtype=dtype)
                return values.tolist()
            if count > len(self.data):  # every element takes at least a byte
                raise HeaderError("an array longer than the file")
            if itype == _STRING:
                return self._strings(count)
            items, bad = [], None
            for _ in range(count):  # read every element even past a bad one: the cursor
                try:  # must end after the array
                    items.append(self.value(itype))
                except UnicodeDecodeError as exc:
                    bad = exc
            if bad is not None:
                raise bad
            return items
        raise HeaderError(f"unknown metadata value type {vtype}")

    def _strings(self, count: int) -> list[str]:
        """An array of `count` strings: `string()` in one loop with its lookups hoisted
        (a 262k-piece vocabulary took 0.65 s through value() per element)."""
        data, pos, end = self.data, self.pos, len(self.data)
        unpack = _U64.unpack_from
        items, bad = [], None
        for _ in range(count):
            if pos + 8 > end:
                raise HeaderError("the header runs past the end of the file")
            (n,) = unpack(data, pos)
            pos += 8
            if pos + n > end:
                raise HeaderError("the header runs past the end of the file")
            try:  # read every element even past a bad one, as value() does
                items.append(str(data[pos : pos + n], "utf-8"))
            except UnicodeDecodeError as exc:
                bad = exc
            pos += n
        self.pos = pos
        if bad is not None:
            raise bad
        return items


def read_header(
    data: memoryview | bytes,
) -> tuple[dict[str, object], dict[str, TensorEntry]]:
    """(metadata, tensors) of a whole GGUF file's bytes (a memory map is fine: only the
    header is touched). Metadata values are plain Python values (lists for arrays); a
    string that is not UTF-8 leaves its key out, as GGUFReader's contents() fails on it.
    Raises HeaderError on anything malformed, including tensors that end past the file."""
    cur = _Cursor(memoryview(data))
    if bytes(cur.raw(4)) != GGUF_MAGIC:
        raise HeaderError("bad magic")
    version = cur.take("<I")
    if version not in (2, 3):
        raise HeaderError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    if n_tensors > len(cur.data) or n_kv > len(cur.data):
        raise HeaderError("counts larger than the file")
    metadata: dict[str, object] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("<I")
        try:
            metadata[key] = cur.value(vtype)
        except UnicodeDecodeError:  # the value was read whole; only its text is unusable
            continue
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        if n_dims == 0 or n_dims > _MAX_DIMS:
            raise HeaderError(f"tensor {name!r}: {n_dims} dimensions")
        shape = tuple(cur.take("<Q") for _ in range(n_dims))
        try:
            qtype = GGMLQuantizationType(cur.take("<I"))
        except ValueError as exc:
            raise HeaderError(f"tensor {name!r}: {exc}") from None
        infos.append((name, shape, qtype, cur.take("<Q")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment {alignment!r} is not a power of two")
    start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorEntry] = {}
    for name, shape, qtype, rel in infos:
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape, dtype=np.int64))
        if shape[0] % block:
            raise HeaderError(
                f"tensor {name!r}: row of {shape[0]} is not whole {qtype.name} blocks"
            )
        nbytes = n // block * size
        offset = start + rel
        if offset + nbytes > len(cur.data):
            raise HeaderError(f"tensor {name!r} runs past the end of the file")
        tensors[name] = TensorEntry(qtype, shape, offset, nbytes)
    return metadata, tensors
