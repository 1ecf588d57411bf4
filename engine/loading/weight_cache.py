"""Prepared weights cached on disk, memory-mapped on the next load.

Dequantising and fusing the weights takes seconds; reading them back from an .npy file is
a memory map. One folder per (weights_version, architecture, layout version):

    <cache_dir>/<weights_version>-<arch>-L<layout>/
        manifest.json   {"format": 1, "tensors": {name: {"file", "shape", "dtype", "sha256"}},
                         "documents": {name: {"file", "sha256"}}}
        000.npy ...     one float32 array per prepared tensor
        d000.json ...   JSON documents: the parsed GGUF header, tokenizer merges ...

A folder is written under a temporary name (".<key>.<pid>.<n>.tmp") and renamed when
complete, so a crash leaves no half-written cache; the temporary folder a killed process
left behind is removed by the next one that writes the cache. On load every file is
checked against its manifest entry (shape, dtype and sha256); anything that does not
match is rebuilt, never trusted. Folders are evicted least-recently-used first when the
cache grows past its size cap.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger("pantheon.engine.weight_cache")

FORMAT = 2
_HASH_CHUNK = 16 << 20
_STAGING_SUFFIX = ".tmp"
_staging_here: set[Path] = set()  # this process's staging folders still being written


def _sha256_of(array: np.ndarray) -> str:
    h = hashlib.sha256()
    flat = array.reshape(-1).view(np.uint8)
    for start in range(0, flat.size, _HASH_CHUNK):
        h.update(flat[start : start + _HASH_CHUNK])
    return h.hexdigest()


class WeightCache:
    """Get-or-build for one model's prepared tensors. Use as a context manager: the entries
    built during `with` are published (atomically) when it exits without an error."""

    def __init__(self, cache_dir: Path, key: str, max_bytes: int):
        self.root = Path(cache_dir)
        self.key = key
        self.max_bytes = max_bytes
        self.dir = self.root / key
        self.hits = 0
        self.misses = 0
        self._manifest, self._documents = self._read_manifest()
        self._staging: Path | None = None
        self._new_entries: dict[str, dict] = {}
        self._new_documents: dict[str, dict] = {}

    @property
    def used(self) -> bool:
        """True when every tensor came from the cache."""
        return self.hits > 0 and self.misses == 0

    def _read_manifest(self) -> tuple[dict, dict]:
        try:
            manifest = json.loads((self.dir / "manifest.json").read_text())
        except (OSError, ValueError):
            return {}, {}
        tensors, documents = manifest.get("tensors"), manifest.get("documents")
        if manifest.get("format") != FORMAT or not isinstance(tensors, dict):
            return {}, {}
        return tensors, documents if isinstance(documents, dict) else {}

    def __enter__(self) -> WeightCache:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        staging = self._staging
        try:
            if exc_type is None and self.misses:
                self._publish()
            elif staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        finally:
            _staging_here.discard(staging)

    def get(self, name: str, build: Callable[[], np.ndarray]) -> np.ndarray:
        cached = self._load(name)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        array = np.ascontiguousarray(build())
        if array.dtype != np.uint8:  # block bytes stay bytes; values are cached as float32
            array = array.astype(np.float32, copy=False)
        self._stage(name, array)
        return array

    def read_json(self, name: str) -> object | None:
        """A cached JSON document if present and intact, else None; writes nothing."""
        entry = self._documents.get(name)
        if entry is None:
            return None
        try:
            raw = (self.dir / entry["file"]).read_bytes()
        except (OSError, KeyError):
            return None
        if hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
            return None
        return json.loads(raw)

    def get_json(self, name: str, build: Callable[[], object]) -> object:
        """A JSON document (a dict or list) cached beside the tensors."""
        entry = self._documents.get(name)
        if entry is not None:
            try:
                raw = (self.dir / entry["file"]).read_bytes()
                if hashlib.sha256(raw).hexdigest() == entry.get("sha256"):
                    self.hits += 1
                    return json.loads(raw)
            except (OSError, ValueError, KeyError):
                pass
            log.warning("weight cache %s: document %s does not match; rebuilding", self.key, name)
        self.misses += 1
        value = build()
        raw = json.dumps(value).encode()
        file = f"d{len(self._new_documents):03d}.json"
        self._ensure_staging()
        (self._staging / file).write_bytes(raw)
        self._new_documents[name] = {"file": file, "sha256": hashlib.sha256(raw).hexdigest()}
        return value

    def _load(self, name: str) -> np.ndarray | None:
        entry = self._manifest.get(name)
        if entry is None:
            return None
        try:
            array = np.load(self.dir / entry["file"], mmap_mode="r")
        except (OSError, ValueError, KeyError):
            log.warning("weight cache %s: %s unreadable; rebuilding", self.key, name)
            return None
        if (
            list(array.shape) != entry.get("shape")
            or str(array.dtype) != entry.get("dtype")
            or _sha256_of(np.asarray(array)) != entry.get("sha256")
        ):
            log.warning(
                "weight cache %s: %s does not match its manifest; rebuilding", self.key, name
            )
            return None
        return array

    def _ensure_staging(self) -> None:
        if self._staging is None:
            self.root.mkdir(parents=True, exist_ok=True)
            _remove_abandoned_staging(self.root)
            name = f".{self.key}.{os.getpid()}.{time.monotonic_ns()}{_STAGING_SUFFIX}"
            self._staging = self.root / name
            self._staging.mkdir()
            _staging_here.add(self._staging)

    def _stage(self, name: str, array: np.ndarray) -> None:
        self._ensure_staging()
        file = f"{len(self._new_entries):03d}.npy"
        np.save(self._staging / file, array)
        self._new_entries[name] = {
            "file": file,
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "sha256": _sha256_of(array),
        }

    def _publish(self) -> None:
        """Replace the folder with one holding exactly the entries built this time, plus the
        still-valid ones (only reached when something had to be rebuilt)."""
        assert self._staging is not None
        for name, entry in self._manifest.items():
            if name in self._new_entries:
                continue
            file = f"{len(self._new_entries):03d}.npy"
            try:
                shutil.copyfile(self.dir / entry["file"], self._staging / file)
            except OSError:
                continue
            self._new_entries[name] = {**entry, "file": file}
        for name, entry in self._documents.items():
            if name in self._new_documents:
                continue
            file = f"d{len(self._new_documents):03d}.json"
            try:
                shutil.copyfile(self.dir / entry["file"], self._staging / file)
            except OSError:
                continue
            self._new_documents[name] = {**entry, "file": file}
        manifest = {
            "format": FORMAT,
            "key": self.key,
            "tensors": self._new_entries,
            "documents": self._new_documents,
        }
        (self._staging / "manifest.json").write_text(json.dumps(manifest))
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        os.replace(self._staging, self.dir)
        self._staging = None
        self._evict()

    def _evict(self) -> None:
        """Drop least-recently-used folders (never this one) until the cache fits its cap."""
        folders = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        sizes = {p: sum(f.stat().st_size for f in p.iterdir()) for p in folders}
        total = sum(sizes.values())
        for folder in sorted(folders, key=lambda p: p.stat().st_mtime):
            if total <= self.max_bytes:
                break
            if folder == self.dir:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            total -= sizes[folder]
            log.info("weight cache: evicted %s (%.0f MB)", folder.name, sizes[folder] / 1e6)


def _remove_abandoned_staging(root: Path) -> None:
    """Delete staging folders whose writer is gone (a process killed mid-build): they are
    never read, but each may hold a whole model's float32 weights. A folder of a live
    process, or one this process is still writing, is left alone."""
    for path in root.iterdir():
        if not (path.name.startswith(".") and path.name.endswith(_STAGING_SUFFIX)):
            continue
        parts = path.name[1 : -len(_STAGING_SUFFIX)].rsplit(".", 2)
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
        if path in _staging_here or (pid != os.getpid() and _pid_alive(pid)):
            continue
        log.warning("weight cache: removing %s, left by an interrupted build", path.name)
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: it exists, owned by someone else
        return True
    return True
