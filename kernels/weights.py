"""Weight handles: a matrix that knows its own storage, and RoPE tables.

The decoder block never looks inside a `Weight`; only the backend that made it does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A matrix made of parts of different block types stacked along `out`; meta["parts"] is
# [(first output row, Weight), ...] and `data` is None.
STACK = "stack"


@dataclass(eq=False)
class Weight:
    """One (out, in) matrix as a backend keeps it.

    storage: "f32", "f16", "bf16" for dense values, or a GGUF block type name ("Q4_1",
    "Q6_K", ...) for the file's blocks kept as they are, or STACK. `data` is the backend's array:
    (out, in) values, or (out, bytes per row) uint8 blocks. `meta` is the backend's own
    (row chunks, device pointers, ...)."""

    storage: str
    shape: tuple[int, int]
    data: Any
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        if self.storage == STACK:
            return sum(part.nbytes for _, part in self.meta["parts"])
        return int(self.data.nbytes)

    @property
    def is_blocks(self) -> bool:
        return self.storage not in ("f32", "f16", "bf16", "f64", STACK)


def stack_parts(parts: list[Weight]) -> Weight:
    """Matrices stacked along `out` as one STACK of parts, each kept as it is (no copy):
    the backend's product fills its output part by part."""
    k = parts[0].shape[1]
    offsets, n = [], 0
    for part in parts:
        offsets.append(n)
        n += part.shape[0]
    return Weight(STACK, (n, k), None, {"parts": list(zip(offsets, parts, strict=True))})


def parts_of(w: Weight) -> list[tuple[int, Weight]]:
    """[(first output row, part), ...]: a STACK's parts, or the matrix itself at row 0."""
    return w.meta["parts"] if w.storage == STACK else [(0, w)]


@dataclass(eq=False)
class RopeTable:
    """cos and sin of position x frequency, (n_pos, dim // 2) each, in a backend's memory."""

    cos: Any
    sin: Any

    def __len__(self) -> int:
        return len(self.cos)
