"""GGUF `qwen3`: the qwen2 block without Q/K/V biases, with QK-norm (handled in qwen2.py,
which reads both from the file); head_dim comes from `attention.key_length`."""

from .qwen2 import Qwen2Model as Qwen3Model
from .qwen2 import load

__all__ = ["Qwen3Model", "load"]
