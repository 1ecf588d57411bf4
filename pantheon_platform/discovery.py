"""Models already on disk (PANTHEON_DISCOVER=1): the GGUFs in Ollama's model store, LM
Studio's models folders and the Hugging Face hub cache, under the names those tools use,
loaded from where they lie (never copied) the first time a request names them.

  Ollama        <OLLAMA_MODELS>/manifests/<registry>/<namespace>/<model>/<tag>: JSON whose
                layer of mediaType application/vnd.ollama.image.model is the GGUF, at
                blobs/sha256-<hex>. Served as Ollama names it: `qwen3:0.6b` (library
                models), `<namespace>/<model>:<tag>`, `<registry>/<namespace>/<model>:<tag>`.
  LM Studio     <dir>/<publisher>/<repo>/<file>.gguf, served as `<publisher>/<repo>/<file>`.
  Hugging Face  <hub>/models--<org>--<repo>/snapshots/<revision>/<file>.gguf (symlinks to
                ../../blobs/<hash>; the revision refs/main names, else the newest), served
                as `<org>/<repo>/<file>`.

Each store is a model folder for confinement while discovery is on
(model_files.discovery_dirs). A file that is not a GGUF, a missing blob or an unreadable
manifest is listed as unloadable with the reason; nothing here raises on a bad store.
Multimodal projectors (mmproj-*.gguf) and the later parts of a split GGUF are not models.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pantheon_platform.model_files import allowed_model_path, discovery_dirs, discovery_enabled

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
GGUF_MAGIC = b"GGUF"
MAX_MANIFEST_BYTES = 1 << 20
LOAD_WAIT_S = 600  # a request waits this long for another request's load of its model
_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})$")


@dataclass(frozen=True)
class FoundModel:
    name: str  # the served name, as the tool that stored it names it
    source: str  # "ollama" | "lmstudio" | "huggingface"
    path: Path  # the file as found (the blob, the snapshot's symlink, the .gguf)
    size_bytes: int = 0
    modified: float = 0.0
    digest: str = ""  # Ollama's sha256 of the blob ("" elsewhere)
    error: str = ""  # why it cannot load; "" when it is a GGUF that may


def discovered() -> list[FoundModel]:
    """Every model found in the stores (none when discovery is off), one per name (the
    first store listing a name keeps it), by name. A scan is reused for SCAN_REUSE_S:
    a request naming an unknown model does not walk the stores each time."""
    global _last_scan
    if not discovery_enabled():
        return []
    stores = tuple((source, tuple(discovery_dirs(source))) for source, _ in SCANS)
    now = time.monotonic()
    last = _last_scan
    if last is not None and last[1] == stores and now - last[0] < SCAN_REUSE_S:
        return list(last[2])
    found: dict[str, FoundModel] = {}
    for (_, scan), (_, roots) in zip(SCANS, stores, strict=True):
        for root in roots:
            for model in _safely(scan, root):
                found.setdefault(model.name, model)
    models = sorted(found.values(), key=lambda m: m.name)
    _last_scan = (now, stores, tuple(models))
    return models


SCAN_REUSE_S = 2.0
_last_scan: tuple[float, tuple, tuple[FoundModel, ...]] | None = None


def find(model: str | None) -> FoundModel | None:
    """The discovered model a request's `model` names: exactly, or with Ollama's implied
    `:latest` added or dropped."""
    if not model or not discovery_enabled():
        return None
    names = {model, f"{model}:latest"} if ":" not in model else {model}
    names.add(model.removesuffix(":latest"))
    return next((m for m in discovered() if m.name in names), None)


def _safely(scan, root: Path) -> Iterator[FoundModel]:
    """A store's models; a store that cannot be read (permissions, a race with a
    deletion) lists what it got so far."""
    try:
        yield from scan(root)
    except OSError:
        return


def checked(name: str, source: str, path: Path, digest: str = "") -> FoundModel:
    """A found file with its size, time and, when it cannot be a model, why."""
    try:
        st = path.stat()
        with path.open("rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as exc:
        return FoundModel(name, source, path, digest=digest, error=f"cannot read {path}: {exc}")
    error = "" if magic == GGUF_MAGIC else f"not a GGUF file (starts with {magic!r})"
    try:
        allowed_model_path(str(path))
    except PermissionError as exc:  # a symlink out of the stores and the model folders
        error = str(exc)
    if not error and (part := _SPLIT_PART.search(path.name.removesuffix(".gguf"))):
        error = f"part 1 of a {int(part.group(2))}-part split GGUF: load a single-file GGUF"
    return FoundModel(name, source, path, st.st_size, st.st_mtime, digest, error)


# --- Ollama ---------------------------------------------------------------------------


def ollama_models(root: Path) -> Iterator[FoundModel]:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(manifests.glob("*/*/*/*")):
        if not manifest.is_file():
            continue
        registry, namespace, model, tag = manifest.relative_to(manifests).parts
        name = ollama_name(registry, namespace, model, tag)
        try:
            if manifest.stat().st_size > MAX_MANIFEST_BYTES:
                raise ValueError("over 1 MiB")
            layers = json.loads(manifest.read_bytes())["layers"]
            layer = next(x for x in layers if x.get("mediaType") == OLLAMA_MODEL_LAYER)
            digest = str(layer["digest"])
        except StopIteration:
            continue  # no weights (a manifest of another kind): not a model
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            yield FoundModel(name, "ollama", manifest, error=f"unreadable manifest: {exc}")
            continue
        algorithm, _, hex_digest = digest.partition(":")
        if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hex_digest):
            yield FoundModel(name, "ollama", manifest, error=f"unexpected digest {digest!r}")
            continue
        yield checked(name, "ollama", root / "blobs" / f"sha256-{hex_digest}", hex_digest)


def ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows: the default registry and `library` namespace left out."""
    if registry == OLLAMA_REGISTRY:
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


# --- LM Studio and Hugging Face ----------------------------------------------------------


def lmstudio_models(root: Path) -> Iterator[FoundModel]:
    for path in sorted(root.glob("*/*/*.gguf")):
        publisher, repo = path.parent.parent.name, path.parent.name
        if _is_model_file(path):
            yield checked(f"{publisher}/{repo}/{_stem(path)}", "lmstudio", path)


def hf_models(root: Path) -> Iterator[FoundModel]:
    for repo_dir in sorted(root.glob("models--*--*")):
        org, _, repo = repo_dir.name.removeprefix("models--").partition("--")
        snapshot = _hf_snapshot(repo_dir)
        if snapshot is None:
            continue
        for path in sorted(snapshot.rglob("*.gguf")):
            if _is_model_file(path):
                yield checked(f"{org}/{repo}/{_stem(path)}", "huggingface", path)


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The revision refs/main names, else the most recently written snapshot."""
    snapshots = repo_dir / "snapshots"
    try:
        main = (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (snapshots / main).is_dir():
        return snapshots / main
    revisions = [p for p in snapshots.glob("*") if p.is_dir()] if snapshots.is_dir() else []
    return max(revisions, key=lambda p: p.stat().st_mtime, default=None)


def _stem(path: Path) -> str:
    return _SPLIT_PART.sub("", path.name.removesuffix(".gguf"))


def _is_model_file(path: Path) -> bool:
    """Not a multimodal projector, not a later part of a split GGUF."""
    if path.name.lower().startswith("mmproj"):
        return False
    part = _SPLIT_PART.search(path.name.removesuffix(".gguf"))
    return part is None or int(part.group(1)) == 1


SCANS = (("ollama", ollama_models), ("lmstudio", lmstudio_models), ("huggingface", hf_models))


# --- loading on request --------------------------------------------------------------------


async def load_if_discovered(model: str | None) -> None:
    """Before a request routes: when `model` names a discovered model that is not served
    yet, load it under that name (off the event loop; a request arriving meanwhile waits
    for the same load). ModelNotFound saying why when it cannot load. Nothing to do when
    discovery is off or the name is served or unknown."""
    from pantheon_platform.runtime import get_runtime

    rt = get_runtime()
    if not model or not discovery_enabled() or rt.follow(model) in rt.services():
        return
    found = await asyncio.to_thread(find, model)
    if found is None or found.name in rt.services():
        return
    await asyncio.to_thread(_load, found)


def _load(found: FoundModel) -> None:
    from pantheon_platform.runtime import (
        FAILED,
        Conflict,
        LoadSpec,
        ModelNotFound,
        OperatorError,
        default_options,
        get_runtime,
    )

    where = f"model {found.name!r} (found in {found.source}'s store)"
    if found.error:
        raise ModelNotFound(f"{where} cannot load: {found.error}")
    rt = get_runtime()
    try:
        rt.load(LoadSpec.of(name=found.name, path=str(found.path), **default_options()))
        return
    except Conflict:  # being loaded by another request (or just loaded): wait for it
        pass
    except OperatorError as exc:
        raise ModelNotFound(f"{where} cannot load: {exc}") from None
    deadline = time.monotonic() + LOAD_WAIT_S
    while found.name not in rt.services() and time.monotonic() < deadline:
        state = rt.states().get(found.name)
        if state is not None and state.state == FAILED:
            raise ModelNotFound(f"{where} failed to load: {state.error}")
        time.sleep(0.1)
