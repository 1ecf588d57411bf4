"""Write tiny random-weight llama GGUFs for tests (real files the engine loads for real).

The vocabulary is byte-level: the 256 GPT-2 byte symbols plus ChatML's control tokens, so
any text tokenizes (one token per byte) and the ChatML fallback template renders.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from engine.text.tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tiny_llama(
    path: Path,
    *,
    n_layer: int = 2,
    d_model: int = 32,
    n_head: int = 4,
    n_kv_head: int = 2,
    d_ff: int = 64,
    context_length: int = 256,
    seed: int = 0,
    broken_ffn_down: bool = False,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.F32,
    matrix_transform=None,
    raw_blocks: bool = False,
    n_vocab: int = 0,
    vocab_from: Path | None = None,
) -> Path:
    """A llama GGUF with random weights. Matrices are stored as `matrix_type` (quantised with
    gguf.quants); `matrix_transform(array) -> array` rewrites each float matrix first.
    `raw_blocks` stores random (valid, finite) blocks of `matrix_type` instead, for the types
    gguf.quants can read but not write; `matrix_transform(array, name)` then sees nothing.
    `broken_ffn_down` gives ffn_down the wrong input width: the file loads, and every
    forward pass fails (a real engine failure). `n_vocab` > 259 pads the vocabulary with
    unused tokens, for a file shaped like a real model (bench/bench_gpu.py). `vocab_from`:
    another GGUF whose tokenizer (every tokenizer.* key) the file takes instead (a tiny
    draft model with a real model's vocabulary)."""
    rng = np.random.default_rng(seed)
    tokens = SPECIALS + [bytes_to_unicode()[b] for b in range(256)]
    tokens += [f"<|unused_{i}|>" for i in range(max(0, n_vocab - len(tokens)))]
    copied = _tokenizer_fields(vocab_from) if vocab_from is not None else {}
    if copied:
        tokens = copied["tokenizer.ggml.tokens"][0]
    head_dim = d_model // n_head

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    def add_matrix(name: str, array: np.ndarray) -> None:
        if raw_blocks:
            w.add_tensor(name, random_blocks(name, array.shape, matrix_type), raw_dtype=matrix_type)
            return
        if matrix_transform is not None:
            array = matrix_transform(array, name)
        if matrix_type == GGMLQuantizationType.F32:
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, quantize(array, matrix_type), raw_dtype=matrix_type)

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_block_count(n_layer)
    w.add_context_length(context_length)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv_head)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    if copied:
        for key, (value, vtype, sub_type) in copied.items():
            w.add_key_value(key, value, vtype, sub_type)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
        w.add_token_merges([])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)

    add_matrix("token_embd.weight", weight(len(tokens), d_model))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d_model, dtype=np.float32))
        add_matrix(p + "attn_q.weight", weight(n_head * head_dim, d_model))
        add_matrix(p + "attn_k.weight", weight(n_kv_head * head_dim, d_model))
        add_matrix(p + "attn_v.weight", weight(n_kv_head * head_dim, d_model))
        add_matrix(p + "attn_output.weight", weight(d_model, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(d_model, dtype=np.float32))
        add_matrix(p + "ffn_gate.weight", weight(d_ff, d_model))
        add_matrix(p + "ffn_up.weight", weight(d_ff, d_model))
        add_matrix(p + "ffn_down.weight", weight(d_model, d_ff + (1 if broken_ffn_down else 0)))
    w.add_tensor("output_norm.weight", np.ones(d_model, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tokenizer_fields(path: Path) -> dict[str, tuple]:
    """Every tokenizer.* key of a GGUF: {key: (value, type, array element type)}."""
    fields = gguf.GGUFReader(str(path)).fields
    out = {}
    for key, field in fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if len(field.types) > 1 else None
            out[key] = (field.contents(), field.types[0], sub_type)
    return out


def random_blocks(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> np.ndarray:
    """Deterministic random bytes forming `shape` in `qtype`. Bytes stay below 0x3C so every
    float16 scale inside a block is finite."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.integers(0, 0x3C, size=(rows, cols // block * type_size), dtype=np.uint8)
