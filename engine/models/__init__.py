"""One module per GGUF `general.architecture`, resolved by name with importlib (a dash in
the name is an underscore in the module's: `gpt-oss` is gpt_oss.py)."""

from __future__ import annotations

import importlib
import pkgutil

from ..types import UnsupportedArchitecture

# Bump when any architecture changes the tensors it prepares at load (fusing, layout): the
# weight cache keys on it, so older cached files are rebuilt rather than misread.
# 2: the cached header records each tensor's file offset (block weights are mapped from
# the GGUF itself; only float32 fallbacks and vectors are cached).
WEIGHT_LAYOUT_VERSION = 2


def supported_architectures() -> list[str]:
    return sorted(
        m.name.replace("_", "-")
        for m in pkgutil.iter_modules(__path__)
        if not m.name.startswith("_")
    )


def architecture_module(name: str):
    if name not in supported_architectures():
        raise UnsupportedArchitecture(
            f"unsupported architecture {name!r}; supported: {', '.join(supported_architectures())}"
        )
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
