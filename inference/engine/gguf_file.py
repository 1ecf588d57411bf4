"""GGUF metadata and tensor index (gguf.GGUFReader), dequantisation and weights_version."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from .types import ModelLoadError

log = logging.getLogger("pantheon.engine.gguf")

GGUF_MAGIC = b"GGUF"
_HASH_CHUNK = 8 << 20


class ModelFileNotFound(ModelLoadError, FileNotFoundError):
    pass


class NotAGGUFFile(ModelLoadError):
    pass


class GGUFFile:
    """One opened GGUF file: metadata as plain Python values, tensors by name."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFileNotFound(f"model file not found: {self.path}")
        with open(self.path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise NotAGGUFFile(f"not a GGUF file (bad magic): {self.path}")
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as exc:  # the library raises ValueError/struct errors on bad files
            raise NotAGGUFFile(f"not a readable GGUF file: {self.path}: {exc}") from exc
        self.metadata: dict[str, object] = {}
        for key, field in self.reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = field.contents()
            except Exception:  # exotic field types we never read
                continue
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._weights_version: str | None = None

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

    def load_f32(self, name: str) -> np.ndarray:
        """Dequantise one tensor to float32, numpy layout (GGUF's ne reversed)."""
        t = self.tensors[name]
        if t.tensor_type == GGMLQuantizationType.F32:
            arr = np.array(t.data, dtype=np.float32)
        else:
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        return np.ascontiguousarray(arr.reshape(shape))

    @property
    def weights_version(self) -> str:
        """Content hash of the file (sha256, first 16 hex digits): same bytes, same version."""
        if self._weights_version is None:
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    h.update(chunk)
            self._weights_version = h.hexdigest()[:16]
        return self._weights_version

    @property
    def n_params(self) -> int:
        return int(sum(int(np.prod(t.shape)) for t in self.reader.tensors))
