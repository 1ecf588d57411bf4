"""Fake stores of models already on disk, laid out as Ollama and huggingface_hub write
them (pantheon_platform/discovery.py reads them): for tests/platform/test_discovery.py
and tests/e2e/test_pantheon_command.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MODEL_LAYER = "application/vnd.ollama.image.model"


def ollama_model(root: Path, name: str, tag: str, blob: bytes, namespace: str = "library"):
    digest = hashlib.sha256(blob).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(blob)
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}", "size": len(blob)},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return digest


def hf_model(hub: Path, org: str, repo: str, filename: str, blob: bytes) -> Path:
    """As huggingface_hub stores a download: the blob by hash, the snapshot's file a
    relative symlink to it, refs/main naming the revision."""
    base = hub / f"models--{org}--{repo}"
    digest = hashlib.sha256(blob).hexdigest()
    (base / "blobs").mkdir(parents=True)
    (base / "blobs" / digest).write_bytes(blob)
    revision = "a" * 40
    snapshot = base / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / filename).symlink_to(Path("..") / ".." / "blobs" / digest)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(revision)
    return snapshot / filename
