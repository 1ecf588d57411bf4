"""The GGUF files under PANTHEON_MODEL_DIRS: what an operator may load, and the console's
"load a model file" choices."""

from __future__ import annotations

import os
from pathlib import Path

from pantheon_platform.discovery import discovered
from pantheon_platform.model_files import model_dirs, model_file_info
from pantheon_platform.runtime import Runtime

MAX_DEPTH = 4  # folders below a model dir that are searched


def gguf_files() -> list[tuple[Path, Path]]:
    """(path as found, real path) of each *.gguf file inside the model folders, once each.
    A symlink pointing out of the folders is left out: it could not be loaded."""
    dirs = model_dirs()
    found: dict[Path, Path] = {}
    for base in dirs:
        if not base.is_dir():
            continue
        for folder, subdirs, names in os.walk(base):
            depth = len(Path(folder).relative_to(base).parts)
            if depth >= MAX_DEPTH:
                subdirs.clear()
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
            for name in sorted(names):
                if not name.lower().endswith(".gguf"):
                    continue
                path = Path(folder) / name
                real = path.resolve()
                if real.is_file() and any(real.is_relative_to(d) for d in dirs):
                    found.setdefault(real, path)
    return sorted(((path, real) for real, path in found.items()), key=lambda pr: str(pr[0]))


def available_models(rt: Runtime) -> list[dict]:
    """One row per file: its metadata (cached by path, size and mtime) and which served
    names it is loaded under; then, with PANTHEON_DISCOVER, the models already on disk
    (Ollama, LM Studio, the Hugging Face cache) under their names, each saying its
    `source`, and why it cannot load when it cannot."""
    served: dict[str, list[str]] = {}
    for info in rt.instances():
        served.setdefault(str(Path(info.svc.path).resolve()), []).append(info.name)
    rows = []
    for path, real in gguf_files():
        row: dict = {"path": str(path), "name": path.name.removesuffix(".gguf")}
        rows.append(_described(row, real, served))
    for found in discovered():
        row = {"path": str(found.path), "name": found.name, "source": found.source}
        if found.error:
            row.update(size_bytes=found.size_bytes, error=found.error, loaded=False, loaded_as=[])
            rows.append(row)
        else:
            rows.append(_described(row, found.path.resolve(), served))
    return rows


def _described(row: dict, real: Path, served: dict[str, list[str]]) -> dict:
    try:
        meta = model_file_info(real)
    except (OSError, ValueError) as exc:  # vanished meanwhile, or not a readable GGUF
        row.update(size_bytes=real.stat().st_size if real.exists() else 0, error=str(exc))
    else:
        row.update(
            size_bytes=meta.size_bytes,
            architecture=meta.architecture,
            quantization=meta.quantization,
            n_params=meta.n_params,
            context_length=meta.context_length or None,
        )
    names = served.get(str(real), [])
    row.update(loaded=bool(names), loaded_as=names)
    return row
