"""GGUF `qwen3`: the qwen2 block without Q/K/V biases, with QK-norm (handled in qwen2.py,
which reads both from the file); head_dim comes from `attention.key_length`."""

from .qwen2 import LAYOUT_VERSION, load
from .qwen2 import Qwen2Model as Qwen3Model

__all__ = ["LAYOUT_VERSION", "Qwen3Model", "load"]
