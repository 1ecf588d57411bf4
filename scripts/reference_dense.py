"""Write tests/reference/tiny/tiny-{granite,olmo2,phi3,gemma2,smollm3}.gguf and their
float32 transformers logits (tests/reference/tiny/tiny_dense_f32.json).

Not part of the project and not run by the tests: it needs PyTorch and transformers
(run it with a venv that has them, e.g. `/work/refvenv/bin/python
scripts/reference_dense.py`). For each architecture it builds a small random-weight
transformers model (hidden 64; Q8_0 or F16 matrices), writes it as a GGUF with that
architecture's real tensor names and metadata keys (as llama.cpp's converter lays them
out: llama-style Q/K rows permuted for interleaved RoPE, Gemma's norms with the +1, Phi-3's
fused qkv and gate/up; an untied output for olmo2) and SmolLM2's vocabulary (the tokenizer metadata of
tests/reference/tiny/tiny-qwen3.gguf), reads the GGUF back, puts every dequantised
weight into the transformers model and records its float32 logits: per-position argmax
and max logit over each prompt, the last position's top-5, 24 greedy steps with their
top-1/top-2 margins (the layout of tiny_models_f32.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers as tf

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "reference" / "tiny"
VOCAB_SOURCE = TINY / "tiny-qwen3.gguf"
PROMPTS = [  # the prompts of tiny_models_f32.json
    [1, 4093, 198, 28120, 905, 314, 2, 198, 1, 520, 9531, 198],
    list(range(100, 140)),
    [17, 42, 4567, 23, 9, 9, 9, 100, 2000, 30000, 49151],
]
GREEDY_STEPS = 24
Q8, F16, F32 = (
    gguf.GGMLQuantizationType.Q8_0,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.F32,
)
V = 49152


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's row order for interleaved (adjacent-pair) RoPE."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


# ---- each architecture: its config, GGUF keys and HF <-> GGUF tensor names ----

COMMON = dict(
    vocab_size=V,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


def arch_granite():
    cfg = tf.GraniteConfig(
        **COMMON,
        intermediate_size=160,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        embedding_multiplier=2.0,
        residual_multiplier=0.8,
        attention_multiplier=0.2,
        logits_scaling=2.0,
    )
    keys = {
        "embedding_scale": 2.0,
        "residual_scale": 0.8,
        "attention.scale": 0.2,
        "logit_scale": 2.0,
    }
    return cfg, tf.GraniteForCausalLM, keys, llama_names, F16


def arch_smollm3():
    cfg = tf.SmolLM3Config(
        **COMMON,
        intermediate_size=128,
        num_hidden_layers=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        no_rope_layer_interval=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return cfg, tf.SmolLM3ForCausalLM, {}, llama_names, Q8


def arch_olmo2():
    # Untied, as every OLMo 2 checkpoint: llama.cpp's olmo2 requires output.weight.
    cfg = tf.Olmo2Config(
        **COMMON | {"tie_word_embeddings": False},
        intermediate_size=160,
        num_hidden_layers=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    return cfg, tf.Olmo2ForCausalLM, {}, olmo2_names, Q8


def arch_phi3():
    rng = np.random.default_rng(7)
    # Phi-4-mini's shape of RoPE: LongRoPE factors over a partial rotation (12 of 16).
    short = [float(x) for x in 1.0 + 0.5 * rng.random(6)]
    long = [float(x) for x in 1.0 + 7.0 * rng.random(6)]
    cfg = tf.Phi3Config(
        **COMMON,
        intermediate_size=128,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=16384,
        original_max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": short,
            "long_factor": long,
            "original_max_position_embeddings": 4096,
            "partial_rotary_factor": 0.75,
        },
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    attn_factor = math.sqrt(1 + math.log(16384 / 4096) / math.log(4096))
    keys = {
        "rope.scaling.original_context_length": ("u32", 4096),
        "rope.scaling.attn_factor": attn_factor,
    }
    extra = {
        "rope_factors_short.weight": np.asarray(short, np.float32),
        "rope_factors_long.weight": np.asarray(long, np.float32),
    }
    return cfg, tf.Phi3ForCausalLM, keys, phi3_names, Q8, extra


def arch_gemma2():
    cfg = tf.Gemma2Config(
        **COMMON | {"num_attention_heads": 4, "num_key_value_heads": 2},
        head_dim=32,
        intermediate_size=128,
        num_hidden_layers=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        query_pre_attn_scalar=32,
        sliding_window=8,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=60.0,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    keys = {
        "attention.sliding_window": ("u32", 8),
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 60.0,
    }
    return cfg, tf.Gemma2ForCausalLM, keys, gemma2_names, F16


def llama_names(i: int) -> dict:
    p, b = f"model.layers.{i}.", f"blk.{i}."
    return {
        p + "input_layernorm.weight": b + "attn_norm.weight",
        p + "self_attn.q_proj.weight": b + "attn_q.weight",
        p + "self_attn.k_proj.weight": b + "attn_k.weight",
        p + "self_attn.v_proj.weight": b + "attn_v.weight",
        p + "self_attn.o_proj.weight": b + "attn_output.weight",
        p + "post_attention_layernorm.weight": b + "ffn_norm.weight",
        p + "mlp.gate_proj.weight": b + "ffn_gate.weight",
        p + "mlp.up_proj.weight": b + "ffn_up.weight",
        p + "mlp.down_proj.weight": b + "ffn_down.weight",
    }


def olmo2_names(i: int) -> dict:
    p, b = f"model.layers.{i}.", f"blk.{i}."
    names = llama_names(i)
    del names[p + "input_layernorm.weight"]
    names[p + "post_attention_layernorm.weight"] = b + "post_attention_norm.weight"
    names[p + "post_feedforward_layernorm.weight"] = b + "post_ffw_norm.weight"
    names[p + "self_attn.q_norm.weight"] = b + "attn_q_norm.weight"
    names[p + "self_attn.k_norm.weight"] = b + "attn_k_norm.weight"
    return names


def phi3_names(i: int) -> dict:
    p, b = f"model.layers.{i}.", f"blk.{i}."
    return {
        p + "input_layernorm.weight": b + "attn_norm.weight",
        p + "self_attn.qkv_proj.weight": b + "attn_qkv.weight",
        p + "self_attn.o_proj.weight": b + "attn_output.weight",
        p + "post_attention_layernorm.weight": b + "ffn_norm.weight",
        p + "mlp.gate_up_proj.weight": b + "ffn_up.weight",
        p + "mlp.down_proj.weight": b + "ffn_down.weight",
    }


def gemma2_names(i: int) -> dict:
    p, b = f"model.layers.{i}.", f"blk.{i}."
    names = llama_names(i)
    names[p + "post_attention_layernorm.weight"] = b + "post_attention_norm.weight"
    names[p + "pre_feedforward_layernorm.weight"] = b + "ffn_norm.weight"
    names[p + "post_feedforward_layernorm.weight"] = b + "post_ffw_norm.weight"
    return names


ARCHS = {
    "granite": arch_granite,
    "olmo2": arch_olmo2,
    "phi3": arch_phi3,
    "gemma2": arch_gemma2,
    "smollm3": arch_smollm3,
}
PERMUTED = {"granite", "smollm3"}  # llama-style converters: Q/K rows for interleaved RoPE


# ---- building and writing ----


def randomise(model, arch: str, seed: int) -> None:
    """Random weights whose logits spread over a few units and depend on every layer."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":  # wide logits from a small tied embedding
                base = 24.0 if arch == "gemma2" else 40.0  # gemma's norms scale by (1 + w)
                p.copy_(base + 4.0 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight"):
                base = 0.0 if arch == "gemma2" else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or name == "lm_head.weight":
                # Small, so that a token's own row does not dominate the residual stream
                # (tied output: the input token would win every position); an untied
                # output at the same scale spreads the logits as much.
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def to_gguf_value(hf_name: str, value: np.ndarray, arch: str, cfg) -> np.ndarray:
    if arch == "gemma2" and hf_name.endswith("norm.weight"):
        return value + 1.0
    if arch in PERMUTED and hf_name.endswith("q_proj.weight"):
        return permute(value, cfg.num_attention_heads)
    if arch in PERMUTED and hf_name.endswith("k_proj.weight"):
        return permute(value, cfg.num_key_value_heads)
    return value


def from_gguf_value(hf_name: str, value: np.ndarray, arch: str, cfg) -> np.ndarray:
    if arch == "gemma2" and hf_name.endswith("norm.weight"):
        return value - 1.0
    if arch in PERMUTED and hf_name.endswith("q_proj.weight"):
        return unpermute(value, cfg.num_attention_heads)
    if arch in PERMUTED and hf_name.endswith("k_proj.weight"):
        return unpermute(value, cfg.num_key_value_heads)
    return value


def name_map(cfg, names) -> dict:
    out = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = "output.weight"
    for i in range(cfg.num_hidden_layers):
        out.update(names(i))
    return out


def write_gguf(
    path: Path, arch: str, cfg, state: dict, names: dict, keys: dict, matrix_type, extra: dict
) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    # Not the architecture's name: llama.cpp reads a name with "phi3" in it as Phi-3's
    # vocabulary (it looks up "</s>"), and these files carry SmolLM2's.
    w.add_name("tiny random-weight test model")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(
        int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    )
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(7 if matrix_type == Q8 else 1)
    for key, value in keys.items():
        if isinstance(value, tuple):
            w.add_uint32(f"{arch}.{key}", value[1])
        else:
            w.add_float32(f"{arch}.{key}", value)
    reader = gguf.GGUFReader(str(VOCAB_SOURCE))
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(field.name, field.contents(), field.types[0], sub)
    for hf_name, gguf_name in names.items():
        value = to_gguf_value(hf_name, state[hf_name], arch, cfg).astype(np.float32)
        if value.ndim == 1:
            w.add_tensor(gguf_name, value)
        elif gguf_name == "token_embd.weight" or matrix_type == Q8:
            w.add_tensor(gguf_name, gguf.quants.quantize(value, Q8), raw_dtype=Q8)
        else:
            w.add_tensor(gguf_name, value.astype(np.float16))
    for gguf_name, value in extra.items():
        w.add_tensor(gguf_name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_back(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {
        t.name: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        for t in reader.tensors
    }


# ---- the reference values ----


@torch.no_grad()
def logits_of(model, ids: list[int]) -> np.ndarray:
    return model(torch.tensor([ids])).logits[0].float().numpy()


def case_of(model, source, prompt: list[int]) -> dict:
    logits = logits_of(model, prompt)
    last = logits[-1]
    top5 = np.argsort(-last)[:5]
    ids, greedy, margins = list(prompt), [], []
    step = last
    for _ in range(GREEDY_STEPS):
        order = np.argsort(-step)[:2]
        greedy.append(int(order[0]))
        margins.append(round(float(step[order[0]] - step[order[1]]), 5))
        ids.append(int(order[0]))
        step = logits_of(model, ids)[-1]
    return {
        "prompt_ids": prompt,
        "last_logits_top5_ids": [int(i) for i in top5],
        "last_logits_top5": [round(float(last[i]), 5) for i in top5],
        "per_position_argmax": [int(i) for i in logits.argmax(-1)],
        "per_position_max_logit": [round(float(x), 5) for x in logits.max(-1)],
        "greedy_ids": greedy,
        "top1_top2_margin": margins,
        "gguf_vs_source_model_max_abs_logit_gap": round(
            float(np.abs(logits - logits_of(source, prompt)).max()), 6
        ),
    }


def build(arch: str, seed: int) -> dict:
    made = ARCHS[arch]()
    cfg, cls, keys, names_of, matrix_type = made[:5]
    extra = made[5] if len(made) > 5 else {}
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    source = cls(cfg).float().eval()
    randomise(source, arch, seed)
    state = {k: v.detach().numpy().copy() for k, v in source.state_dict().items()}
    names = name_map(cfg, names_of)
    path = TINY / f"tiny-{arch}.gguf"
    write_gguf(path, arch, cfg, state, names, keys, matrix_type, extra)
    stored = read_back(path)
    model = cls(cfg).float().eval()
    new_state = {
        hf: torch.from_numpy(from_gguf_value(hf, stored[g], arch, cfg).reshape(state[hf].shape))
        for hf, g in names.items()
    }
    if cfg.tie_word_embeddings and "lm_head.weight" in model.state_dict():
        new_state["lm_head.weight"] = new_state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(new_state, strict=False)
    assert not unexpected and all(m == "lm_head.weight" or "rotary" in m for m in missing), (
        missing,
        unexpected,
    )
    kinds = "Q8_0 matrices" if matrix_type == Q8 else "F16 matrices, Q8_0 token_embd"
    return {
        "gguf": path.name,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "weights": f"{kinds}, F32 norms",
        "transformers": f"{cls.__name__} {tf.__version__}, float32, eager attention",
        "cases": [case_of(model, source, p) for p in PROMPTS],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archs", nargs="*", default=list(ARCHS))
    args = parser.parse_args()
    out = TINY / "tiny_dense_f32.json"
    data = json.loads(out.read_text()) if out.exists() else {"models": []}
    for seed, arch in enumerate(ARCHS):
        if arch not in args.archs:
            continue
        entry = build(arch, seed + 1)
        data["models"] = [m for m in data["models"] if m["gguf"] != entry["gguf"]] + [entry]
        print(arch, [min(c["top1_top2_margin"]) for c in entry["cases"]])
        data["models"].sort(key=lambda m: list(ARCHS).index(m["gguf"][5:-5]))
        out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
