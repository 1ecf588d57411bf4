"""The model folders (PANTHEON_MODEL_DIRS) and what a GGUF holds, read without loading it.

Only files inside the folders may be loaded: `allowed_model_path` follows symlinks and
refuses anything that ends up outside. `model_file_info` reads a file's metadata for the
available list and for admission, cached by (path, size, mtime) because GGUFReader takes
seconds on a large vocabulary. Errors are builtins (PermissionError, FileNotFoundError,
ValueError); pantheon_platform.runtime turns them into operator refusals.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from kernels import CPU_KERNEL_TYPES

# Mirrors the engine's DEFAULT_CTX_CAP (the window when ctx_cap is 0); only estimates use it.
ENGINE_DEFAULT_CTX = 8192


def model_dirs() -> list[Path]:
    from django.conf import settings

    return [Path(d) for d in getattr(settings, "PANTHEON_MODEL_DIRS", [])]


def discovery_enabled() -> bool:
    from django.conf import settings

    return bool(getattr(settings, "PANTHEON_DISCOVER", False))


def discovery_dirs(source: str | None = None) -> list[Path]:
    """The stores of models already on disk (Ollama, LM Studio, the Hugging Face cache:
    pantheon_platform/discovery.py) that exist, `source`'s only when given; none while
    PANTHEON_DISCOVER is off. Each is a model folder for confinement."""
    from django.conf import settings

    if not discovery_enabled():
        return []
    stores = getattr(settings, "PANTHEON_DISCOVER_DIRS", {})
    sources = [source] if source else list(stores)
    return [Path(d) for s in sources for d in stores.get(s, ()) if Path(d).is_dir()]


def allowed_model_path(path: str) -> Path:
    """`path` with symlinks followed, if it lies inside one of PANTHEON_MODEL_DIRS (or,
    with PANTHEON_DISCOVER, one of the stores of models already on disk).

    A relative path is looked up in each model folder. Raises PermissionError naming the
    folders for anything else (`..` escapes and symlinks pointing out included).
    """
    dirs = [*model_dirs(), *discovery_dirs()]
    given = Path(path).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        candidates = [d / given for d in dirs]
        # The first folder that has the file; else the first, so that a missing file is a 404
        candidates.sort(key=lambda p: not _exists(p))
    for candidate in candidates:
        resolved = candidate.resolve()
        if any(resolved.is_relative_to(d) for d in dirs):
            return resolved
    allowed = ", ".join(str(d) for d in dirs) or "none configured"
    raise PermissionError(
        f"{path!r} is outside the model folders; models load only from PANTHEON_MODEL_DIRS: "
        f"{allowed}"
    )


def _exists(path: Path) -> bool:
    """Path.exists(), False also for a name the filesystem cannot hold (ENAMETOOLONG and
    the like raise from Path.exists; a client may send such a name)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def is_file(path: Path) -> bool:
    """Path.is_file(), False also for a name the filesystem cannot hold."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class ModelFileInfo:
    """What an operator (and admission) needs to know about a GGUF without loading it."""

    path: str
    size_bytes: int
    architecture: str
    quantization: str
    n_params: int
    # Weight bytes on the compiled CPU backend: tensors of a type with a kernel as the
    # file holds them, the others as float32 (what the fallback dequantises them to).
    block_bytes: int
    context_length: int  # 0 = not in the metadata
    n_layer: int
    n_kv_head: int
    head_dim: int

    def context(self, ctx_cap: int) -> int:
        """The window the engine would serve for this ctx_cap."""
        train = self.context_length or ENGINE_DEFAULT_CTX
        return min(ctx_cap, train) if ctx_cap > 0 else min(train, ENGINE_DEFAULT_CTX)

    def weight_bytes(self, kernel: str) -> int:
        """Weights in memory: the file's blocks on the compiled `cpu` kernels, float32
        on the numpy reference (which dequantises at load)."""
        return self.block_bytes if kernel == "cpu" else self.n_params * 4

    def estimate_bytes(
        self, ctx_cap: int, max_sessions: int, kernel: str = "numpy", kv_row_bytes: int = 0
    ) -> int:
        """Weights as `kernel` holds them plus K and V for `max_sessions` sessions of the
        served window; `kv_row_bytes`: one position of one KV head in the model's KV type
        (0: float32, head_dim * 4; runtime.devices.kv_row_bytes)."""
        row = kv_row_bytes or self.head_dim * 4
        kv_per_token = 2 * self.n_layer * self.n_kv_head * row
        kv = kv_per_token * self.context(ctx_cap) * max(1, max_sessions)
        return self.weight_bytes(kernel) + kv


_cache_lock = threading.Lock()
_cache: dict[str, tuple[tuple[int, int], ModelFileInfo | Exception]] = {}


def model_file_info(path: str | Path) -> ModelFileInfo:
    """Metadata of a GGUF file, cached until its size or mtime changes. Raises
    FileNotFoundError, or ValueError for a file that is not a readable GGUF."""
    from django.conf import settings

    from engine import ModelFileNotFound, peek_gguf

    path = str(path)
    try:
        st = Path(path).stat()
    except OSError:
        raise FileNotFoundError(f"model file not found: {path}") from None
    key = (st.st_size, st.st_mtime_ns)
    with _cache_lock:
        cached = _cache.get(path)
    if cached is None or cached[0] != key:
        try:
            # The weight cache's copy of the parsed header, when a load already made one,
            # spares the seconds GGUFReader takes on a large vocabulary.
            cache_dir = getattr(settings, "PANTHEON_ENGINE_OPTIONS", {}).get("weight_cache_dir", "")
            value: ModelFileInfo | Exception = _read(peek_gguf(path, cache_dir), st.st_size)
        except ModelFileNotFound:
            raise FileNotFoundError(f"model file not found: {path}") from None
        except Exception as exc:  # not a GGUF, truncated ...: remembered, not re-parsed
            value = ValueError(f"cannot read {path}: {exc}")
        with _cache_lock:
            _cache[path] = (key, value)
        cached = (key, value)
    if isinstance(cached[1], Exception):
        raise cached[1]
    return cached[1]


def _read(gf, size: int) -> ModelFileInfo:
    def arch_int(key: str, default: int = 0) -> int:
        value = gf.arch_value(key, default)
        return int(value[0] if isinstance(value, list) else value)  # per-layer lists

    n_head = arch_int("attention.head_count", 1) or 1
    head_dim = arch_int("attention.key_length") or arch_int("embedding_length") // n_head
    return ModelFileInfo(
        path=str(gf.path),
        size_bytes=size,
        architecture=gf.architecture,
        quantization=gf.quantization,
        n_params=gf.n_params,
        block_bytes=gf.block_bytes(CPU_KERNEL_TYPES),
        context_length=arch_int("context_length"),
        n_layer=arch_int("block_count"),
        n_kv_head=arch_int("attention.head_count_kv") or n_head,
        head_dim=head_dim,
    )
