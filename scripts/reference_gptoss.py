#!/usr/bin/env python3
"""Write tests/reference/tiny/tiny-gptoss.gguf and its float32 transformers reference.

    /work/refvenv/bin/python scripts/reference_gptoss.py [--out tests/reference/tiny]

Not part of the project and not run by the tests (they read what it wrote): it needs
PyTorch and transformers (a separate venv with torch CPU, transformers and gguf).

The GGUF is a random-weight `gpt-oss` with llama.cpp's real tensor names and metadata
keys: 4 layers (even ones see a sliding window of 8 positions, odd ones everything),
hidden 64, 4 query / 2 KV heads of 32, attention sinks, q/k/v/o biases, 8 experts of
width 96 with biases, top-4 routing (softmax over the chosen 4 logits, with a router
bias), the clamped SwiGLU (the expert gate/up weights are scaled so the clamps at 7 bite),
YaRN RoPE (factor 8 over an original context of 512, base 150000). The experts are MXFP4
(as real gpt-oss files store them), the other matrices (embedding, attention, output)
Q8_0, the router, biases, sinks and norms F32. The
vocabulary and chat template are those of tiny-moe (SmolLM2's first 8192 tokens,
scripts/reference_moe.py).

The reference is transformers' GptOssForCausalLM in float32 with every weight replaced by
the GGUF's stored value, eager attention and eager experts (its interleaved gate_up_proj
built from the file's separate gate and up stacks). What it records per prompt is what
scripts/reference_moe.py records (with the router gap between the k-th and (k+1)-th
router logit, bias included).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from reference_moe import N_GREEDY, N_VOCAB, PROMPTS, read_vocabulary

ROOT = Path(__file__).resolve().parents[1]
NAME = "tiny-gptoss.gguf"
SEED = 11
DIMS = dict(
    n_layer=4, d_model=64, n_head=4, n_kv_head=2, head_dim=32, n_expert=8, n_used=4, d_expert=96
)
WINDOW = 8
ROPE = dict(base=150000.0, factor=8.0, orig_ctx=512, ctx=4096)
GATE_UP_SCALE = 4.0  # pre-activations of std ~4: a fair share beyond the clamp at 7


def random_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """float32 weights by GGUF tensor name, in numpy layout (out, in) / (E, out, in)."""
    d = DIMS
    D, Dh, E, F = d["d_model"], d["head_dim"], d["n_expert"], d["d_expert"]
    H, Hkv = d["n_head"], d["n_kv_head"]

    def w(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def b(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out = {"token_embd.weight": w(N_VOCAB, D, scale=8.0)}
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = norm(D)
        out[p + "attn_q.weight"] = w(H * Dh, D, scale=2.0)
        out[p + "attn_q.bias"] = b(H * Dh)
        out[p + "attn_k.weight"] = w(Hkv * Dh, D, scale=2.0)
        out[p + "attn_k.bias"] = b(Hkv * Dh)
        out[p + "attn_v.weight"] = w(Hkv * Dh, D)
        out[p + "attn_v.bias"] = b(Hkv * Dh)
        out[p + "attn_output.weight"] = w(D, H * Dh)
        out[p + "attn_output.bias"] = b(D)
        out[p + "attn_sinks.weight"] = (1.0 + rng.standard_normal(H)).astype(np.float32)
        out[p + "post_attention_norm.weight"] = norm(D)
        out[p + "ffn_gate_inp.weight"] = w(E, D, scale=3.0)
        out[p + "ffn_gate_inp.bias"] = b(E)
        out[p + "ffn_gate_exps.weight"] = w(E, F, D, scale=GATE_UP_SCALE)
        out[p + "ffn_gate_exps.bias"] = b(E, F)
        out[p + "ffn_up_exps.weight"] = w(E, F, D, scale=GATE_UP_SCALE)
        out[p + "ffn_up_exps.bias"] = b(E, F)
        out[p + "ffn_down_exps.weight"] = w(E, D, F)
        out[p + "ffn_down_exps.bias"] = b(E, D)
    out["output_norm.weight"] = norm(D)
    out["output.weight"] = w(N_VOCAB, D, scale=4.0)
    return out


def stored(name: str, array: np.ndarray) -> tuple[np.ndarray, Q]:
    """The tensor as the file stores it: vectors, biases, sinks and the router F32, the
    experts MXFP4, other matrices Q8_0."""
    if array.ndim == 1 or name.endswith((".bias", "ffn_gate_inp.weight")):
        return array, Q.F32
    if name.endswith("_exps.weight"):
        return quantize(array, Q.MXFP4), Q.MXFP4
    return quantize(array, Q.Q8_0), Q.Q8_0


def write_gguf(path: Path, weights: dict[str, np.ndarray], vocab: dict) -> dict[str, np.ndarray]:
    """Write the file; returns each tensor's stored value, dequantised (what the engine reads)."""
    d = DIMS
    w = gguf.GGUFWriter(str(path), arch="gpt-oss")
    w.add_name("tiny-gptoss (random weights, test only)")
    w.add_block_count(d["n_layer"])
    w.add_context_length(ROPE["ctx"])
    w.add_embedding_length(d["d_model"])
    w.add_feed_forward_length(d["d_expert"])
    w.add_head_count(d["n_head"])
    w.add_head_count_kv(d["n_kv_head"])
    w.add_rope_freq_base(ROPE["base"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_key_length(d["head_dim"])
    w.add_value_length(d["head_dim"])
    w.add_sliding_window(WINDOW)
    w.add_expert_count(d["n_expert"])
    w.add_expert_used_count(d["n_used"])
    w.add_expert_feed_forward_length(d["d_expert"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(ROPE["factor"])
    w.add_rope_scaling_orig_ctx_len(ROPE["orig_ctx"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab["tokens"])
    w.add_token_merges(vocab["merges"])
    w.add_token_types(vocab["types"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(vocab["template"])
    values = {}
    for name, array in weights.items():
        data, qtype = stored(name, array)
        if qtype == Q.F32:
            w.add_tensor(name, data)
            values[name] = data
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
            values[name] = dequantize(data, qtype).reshape(array.shape).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


def reference_model(values: dict[str, np.ndarray]):
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    d = DIMS
    config = GptOssConfig(
        vocab_size=N_VOCAB,
        hidden_size=d["d_model"],
        intermediate_size=d["d_expert"],
        num_hidden_layers=d["n_layer"],
        num_attention_heads=d["n_head"],
        num_key_value_heads=d["n_kv_head"],
        head_dim=d["head_dim"],
        num_local_experts=d["n_expert"],
        num_experts_per_tok=d["n_used"],
        sliding_window=WINDOW,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": ROPE["base"],
            "factor": ROPE["factor"],
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": ROPE["orig_ctx"],
        },
        max_position_embeddings=ROPE["ctx"],
        tie_word_embeddings=False,
        attention_bias=True,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    assert config.layer_types == ["sliding_attention", "full_attention"] * (d["n_layer"] // 2)
    model = GptOssForCausalLM(config).float().eval()
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()}
    state = {
        "model.embed_tokens.weight": t["token_embd.weight"],
        "model.norm.weight": t["output_norm.weight"],
        "lm_head.weight": t["output.weight"],
    }
    E, F, D = d["n_expert"], d["d_expert"], d["d_model"]
    for i in range(d["n_layer"]):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        # transformers' experts multiply x @ W with W (E, in, out), gate and up interleaved.
        gate_up = torch.empty(E, D, 2 * F)
        gate_up[..., ::2] = t[p + "ffn_gate_exps.weight"].transpose(1, 2)
        gate_up[..., 1::2] = t[p + "ffn_up_exps.weight"].transpose(1, 2)
        gate_up_bias = torch.empty(E, 2 * F)
        gate_up_bias[:, ::2] = t[p + "ffn_gate_exps.bias"]
        gate_up_bias[:, 1::2] = t[p + "ffn_up_exps.bias"]
        state |= {
            h + "input_layernorm.weight": t[p + "attn_norm.weight"],
            h + "post_attention_layernorm.weight": t[p + "post_attention_norm.weight"],
            h + "self_attn.sinks": t[p + "attn_sinks.weight"],
            h + "mlp.router.weight": t[p + "ffn_gate_inp.weight"],
            h + "mlp.router.bias": t[p + "ffn_gate_inp.bias"],
            h + "mlp.experts.gate_up_proj": gate_up,
            h + "mlp.experts.gate_up_proj_bias": gate_up_bias,
            h + "mlp.experts.down_proj": t[p + "ffn_down_exps.weight"].transpose(1, 2),
            h + "mlp.experts.down_proj_bias": t[p + "ffn_down_exps.bias"],
        }
        for ours, theirs in (
            ("q", "q_proj"),
            ("k", "k_proj"),
            ("v", "v_proj"),
            ("output", "o_proj"),
        ):
            state[h + f"self_attn.{theirs}.weight"] = t[p + f"attn_{ours}.weight"]
            state[h + f"self_attn.{theirs}.bias"] = t[p + f"attn_{ours}.bias"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    return model


def router_gap_hooks(model, gaps: list[float]) -> None:
    """Record, on every forward, the smallest gap between the k-th and (k+1)-th router logit."""
    k = DIMS["n_used"]

    def hook(_module, _inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        top = logits.float().topk(k + 1, dim=-1).values
        gaps.append(float((top[..., k - 1] - top[..., k]).min()))

    for layer in model.model.layers:
        layer.mlp.router.register_forward_hook(hook)


def run_case(model, prompt: list[int]) -> dict:
    import torch

    gaps: list[float] = []
    with torch.no_grad():
        router_gap_hooks(model, gaps)
        logits = model(torch.tensor([prompt])).logits[0].double().numpy()
        last = logits[-1]
        top5 = np.argsort(-last)[:5]
        ids = list(prompt)
        greedy, margins = [], []
        for _ in range(N_GREEDY):
            step = model(torch.tensor([ids])).logits[0, -1].double().numpy()
            order = np.argsort(-step)
            greedy.append(int(order[0]))
            margins.append(round(float(step[order[0]] - step[order[1]]), 5))
            ids.append(int(order[0]))
    for layer in model.model.layers:
        layer.mlp.router._forward_hooks.clear()
    return {
        "prompt_ids": prompt,
        "last_logits_top5_ids": [int(i) for i in top5],
        "last_logits_top5": [round(float(last[i]), 5) for i in top5],
        "per_position_argmax": [int(i) for i in logits.argmax(-1)],
        "per_position_max_logit": [round(float(v), 5) for v in logits.max(-1)],
        "greedy_ids": greedy,
        "top1_top2_margin": margins,
        "min_router_gap": round(min(gaps), 6),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "reference" / "tiny")
    args = ap.parse_args()
    import torch

    torch.manual_seed(0)
    vocab = read_vocabulary()
    path = args.out / NAME
    values = write_gguf(path, random_weights(np.random.default_rng(SEED)), vocab)
    model = reference_model(values)
    entry = {
        "gguf": NAME,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "weights": "MXFP4 experts (stacked), Q8_0 other matrices; F32 router, biases, sinks, norms",
        "reference": "transformers GptOssForCausalLM, float32, eager attention and experts",
        "window": WINDOW,
        "yarn_attention_factor": round(0.1 * math.log(ROPE["factor"]) + 1.0, 7),
        "cases": [run_case(model, p) for p in PROMPTS],
    }
    out = args.out / "tiny_gptoss_f32.json"
    out.write_text(json.dumps({"models": [entry]}, indent=1) + "\n", "utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes) and {out}")
    for case in entry["cases"]:
        print("min router gap", case["min_router_gap"], "min margin", min(case["top1_top2_margin"]))


if __name__ == "__main__":
    main()
