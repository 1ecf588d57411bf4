"""Opening a GGUF: its header parsed once, from the weight cache when that holds it.

The weight cache keeps a file's parsed header (tensor index and metadata) beside its
prepared tensors, keyed by the bytes' version and the weight layout, so a file already
loaded once is opened (and peeked at for the model list) without a GGUFReader parse.
"""

from __future__ import annotations

from pathlib import Path

from ..models import WEIGHT_LAYOUT_VERSION
from ..types import ModelConfig
from .gguf_file import GGUFFile, file_weights_version
from .weight_cache import WeightCache

HEADER_DOCUMENT = "gguf-header"


def cache_key(version: str) -> str:
    """The weight cache entry of these bytes under the current weight layout."""
    return f"{version}-L{WEIGHT_LAYOUT_VERSION}"


def peek_gguf(path: str, weight_cache_dir: str = "") -> GGUFFile:
    """A GGUF's metadata and tensor index without loading it: from the weight cache when it
    holds these bytes' parsed header (no GGUFReader parse), else parsed. Writes nothing."""
    if weight_cache_dir and Path(path).is_file():
        version = file_weights_version(path)
        header = WeightCache(Path(weight_cache_dir), cache_key(version), 0).read_json(
            HEADER_DOCUMENT
        )
        if isinstance(header, dict):
            return GGUFFile(path, header, weights_version=version)
    return GGUFFile(path)


def open_gguf(config: ModelConfig) -> tuple[GGUFFile, WeightCache | None]:
    """The GGUF with its header parsed once (from the weight cache when that holds these
    bytes' header), and the cache entry for these bytes (None without a cache dir)."""
    if not config.weight_cache_dir:
        return GGUFFile(config.path), None
    if not Path(config.path).is_file():
        return GGUFFile(config.path), None  # raises the clear "not found"
    version = file_weights_version(config.path)
    cache = WeightCache(
        Path(config.weight_cache_dir),
        cache_key(version),
        config.weight_cache_max_bytes,
    )
    parsed: list[GGUFFile] = []

    def parse() -> dict:
        parsed.append(GGUFFile(config.path, weights_version=version))
        return parsed[0].header()

    header = cache.get_json(HEADER_DOCUMENT, parse)
    gf = parsed[0] if parsed else GGUFFile(config.path, header, weights_version=version)
    return gf, cache
