"""GGUF block dequantisation, shared by the seam (kernels.backend) and the numpy
reference (kernels.reference.backend); it imports neither, so neither imports the other."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def dequantize_rows(blocks: np.ndarray, qtype: GGMLQuantizationType, dtype) -> np.ndarray:
    """GGUF blocks (rows, bytes per row) -> (rows, in) values: the dequantisation oracle."""
    return dequantize(blocks, qtype).astype(dtype, copy=False)
