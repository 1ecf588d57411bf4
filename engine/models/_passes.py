"""The passes the shared block runs (`_block.py`): which product the backend uses and how
attention reads the KV cache, for one sequence's prompt chunk (`Prefill`), several
sequences' chunks packed (`PackedPrefill`) or one new token for each of B sequences
(`Decode`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernels.backend import Backend
from kernels.weights import Weight


class Prefill:
    """A chunk of T prompt tokens of one sequence at positions start.. on one slot."""

    prefill = True

    def __init__(self, backend: Backend, kv, slot: int, start: int, n: int):
        self.backend, self.kv, self.slot, self.start = backend, kv, slot, start
        self.positions = np.arange(start, start + n)

    def linear(self, x, w: Weight):
        return self.backend.linear_prefill(x, w)

    def attention(self, q, k, v, layer: int, scale: float, window: int, softcap: float, sinks):
        return self.backend.attention_prefill(
            q, k, v, self.kv, layer, self.slot, self.start, scale, window, softcap, sinks
        )


class PackedPrefill:
    """Prompt chunks of several sequences in one pass: their rows stacked for the products
    and the row-wise ops, attention chunk by chunk on each one's slot and positions.

    Only for a backend whose `linear_prefill` computes an output row from that row of x
    alone (`Backend.packs_prefill`), for chunks longer than its `prefill_direct_rows`
    (shorter ones take its row kernel when alone): then every chunk's values are the bits
    its own `Prefill` pass gives, whatever it is packed with; the gain is one walk over
    the weights (and one Python pass over the layers) for all of them."""

    prefill = True

    def __init__(self, backend: Backend, kv, chunks: Sequence[tuple[int, int, int]]):
        # chunks: (slot, start, n) in row order
        self.backend, self.kv, self.chunks = backend, kv, list(chunks)
        self.positions = np.asarray(
            [p for _, start, n in self.chunks for p in range(start, start + n)], dtype=np.int64
        )

    def linear(self, x, w: Weight):
        return self.backend.linear_prefill(x, w)

    def attention(self, q, k, v, layer: int, scale: float, window: int, softcap: float, sinks):
        return self.backend.attention_prefill_packed(
            q, k, v, self.kv, layer, self.chunks, scale, window, softcap, sinks
        )


class Decode:
    """One new token for each of B sequences: row b at positions[b] on slots[b]."""

    prefill = False

    def __init__(self, backend: Backend, kv, slots: Sequence[int], positions: np.ndarray):
        self.backend, self.kv, self.slots, self.positions = backend, kv, slots, positions

    def linear(self, x, w: Weight):
        return self.backend.linear(x, w)

    def attention(self, q, k, v, layer: int, scale: float, window: int, softcap: float, sinks):
        return self.backend.attention_decode(
            q, k, v, self.kv, layer, self.slots, self.positions, scale, window, softcap, sinks
        )
