"""GGUF metadata and tensor index (gguf.GGUFReader), dequantisation and weights_version.

Opening a GGUF with GGUFReader costs seconds on a large vocabulary (one numpy view per
token string). The parsed header — metadata and tensor index — is plain data, so it can
be cached by content (weights_version) and handed back: the reader is then only created
when a tensor actually has to be read.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, LlamaFileType
from gguf.quants import dequantize

from ..types import ModelLoadError
from .gguf_header import read_header

log = logging.getLogger("pantheon.engine.gguf")

GGUF_MAGIC = b"GGUF"
_HASH_CHUNK = 8 << 20


def file_weights_version(path: str | os.PathLike) -> str:
    """Content hash of a file (sha256, first 16 hex digits): same bytes, same version."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()[:16]


class ModelFileNotFound(ModelLoadError, FileNotFoundError):
    pass


class NotAGGUFFile(ModelLoadError):
    pass


@dataclass(frozen=True)
class TensorInfo:
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: ne[0] (the row length) first

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class GGUFFile:
    """One GGUF file: metadata as plain Python values, tensors by name.

    `header` (from `header()` of an earlier open of the same bytes) skips the parse.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        header: dict | None = None,
        weights_version: str | None = None,
    ):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileNotFound(f"model file not found: {self.path}")
        with open(self.path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise NotAGGUFFile(f"not a GGUF file (bad magic): {self.path}")
        self._weights_version = weights_version  # the caller hashed these bytes already
        # Where each tensor's bytes start in the file: with these, tensors are read from
        # one memory map of the file without GGUFReader's parse (seconds on a large
        # vocabulary), which is what makes a cached load a map.
        self.offsets: dict[str, int] = {}
        if header is None:
            # Parsed now, so a damaged file is refused at open.
            try:
                self.metadata, entries = read_header(self._file_map)
            except (ValueError, OSError) as exc:  # HeaderError is a ValueError
                raise NotAGGUFFile(f"not a readable GGUF file: {self.path}: {exc}") from exc
            self.tensors = {n: TensorInfo(e.tensor_type, e.shape) for n, e in entries.items()}
            self.offsets = {n: e.offset for n, e in entries.items()}
        else:
            self.metadata = header["metadata"]
            self.tensors = {}
            for name, (kind, shape, *offset) in header["tensors"].items():
                self.tensors[name] = TensorInfo(GGMLQuantizationType(kind), tuple(shape))
                if offset:
                    self.offsets[name] = int(offset[0])

    @functools.cached_property
    def reader(self) -> GGUFReader:
        try:
            return GGUFReader(self.path, "r")
        except Exception as exc:  # the library raises ValueError/struct errors on bad files
            raise NotAGGUFFile(f"not a readable GGUF file: {self.path}: {exc}") from exc

    @functools.cached_property
    def _reader_tensors(self) -> dict:
        return {t.name: t for t in self.reader.tensors}

    def header(self) -> dict:
        """Metadata and tensor index as JSON-able data (see `header=`)."""
        return {
            "metadata": self.metadata,
            "tensors": {
                n: [
                    int(t.tensor_type),
                    list(t.shape),
                    *([self.offsets[n]] if n in self.offsets else []),
                ]
                for n, t in self.tensors.items()
            },
        }

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default=None):
        """`{architecture}.{key}` metadata, e.g. arch_value("block_count")."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def has_tensor(self, name: str) -> bool:
        return name in self.tensors

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self.tensors[name].tensor_type

    @functools.cached_property
    def _file_map(self) -> np.ndarray:
        return np.memmap(self.path, dtype=np.uint8, mode="r")

    def _raw(self, name: str) -> np.ndarray | None:
        """A tensor's bytes as (rows, bytes per row) from the file's memory map, or None
        when its offset is unknown (an old cached header)."""
        offset = self.offsets.get(name)
        if offset is None:
            return None
        info = self.tensors[name]
        block, size = GGML_QUANT_SIZES[info.tensor_type]
        row_bytes = info.shape[0] // block * size
        rows = info.n_elements // info.shape[0]
        end = offset + rows * row_bytes
        if end > len(self._file_map):
            raise NotAGGUFFile(f"tensor {name!r} runs past the end of {self.path}")
        return self._file_map[offset:end].reshape(rows, row_bytes)

    def load_f32(self, name: str) -> np.ndarray:
        """Dequantise one tensor to float32, numpy layout (GGUF's ne reversed)."""
        raw = self._raw(name)
        if raw is not None:
            info = self.tensors[name]
            shape = tuple(reversed(info.shape))
            values = dequantize(raw, info.tensor_type).astype(np.float32, copy=False)
            return np.ascontiguousarray(values.reshape(shape))
        t = self._reader_tensors[name]
        if t.tensor_type == GGMLQuantizationType.F32:
            arr = np.array(t.data, dtype=np.float32)
        else:
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        return np.ascontiguousarray(arr.reshape(shape))

    def load_blocks(self, name: str) -> np.ndarray:
        """A matrix's bytes as the file holds them: (rows, bytes per row) uint8, memory-
        mapped from the file (no copy)."""
        raw = self._raw(name)
        if raw is not None:
            return raw
        t = self._reader_tensors[name]
        rows = int(np.prod(t.shape.tolist()[1:]))
        return np.asarray(t.data).view(np.uint8).reshape(rows, -1)

    @property
    def weights_version(self) -> str:
        """Content hash of the file (sha256, first 16 hex digits): same bytes, same version."""
        if self._weights_version is None:
            self._weights_version = file_weights_version(self.path)
        return self._weights_version

    @property
    def quantization(self) -> str:
        """general.file_type's name (Q4_1, Q4_K_M ...), else the type holding most weights."""
        file_type = self.metadata.get("general.file_type")
        if file_type is not None:
            try:
                return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
            except ValueError:
                pass
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + t.n_elements
        return max(counts, key=counts.__getitem__) if counts else "unknown"

    def stored_bytes(self, name: str) -> int:
        """Bytes of one tensor as the file stores it."""
        t = self.tensors[name]
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        return t.n_elements // block * size

    def block_bytes(self, kernel_types: frozenset[str]) -> int:
        """Bytes of the tensors as a backend with kernels for `kernel_types` holds them:
        those types as the file stores them, every other type as float32."""
        total = 0
        for name, t in self.tensors.items():
            if t.tensor_type.name in kernel_types:
                total += self.stored_bytes(name)
            else:
                total += t.n_elements * 4
        return total

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())
