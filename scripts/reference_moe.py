#!/usr/bin/env python3
"""Write tests/reference/tiny/tiny-qwen3moe.gguf and its float32 transformers reference.

    /work/refvenv/bin/python scripts/reference_moe.py [--out tests/reference/tiny]

Not part of the project and not run by the tests (they read what it wrote): it needs
PyTorch and transformers (a separate venv with torch CPU, transformers and gguf).

The GGUF is a random-weight `qwen3moe` with llama.cpp's real tensor names and metadata
keys: 2 layers, hidden 64, 4 query / 2 KV heads of 32, 8 experts of width 96, top-2 with
the chosen weights renormalised. Matrices (embedding, attention, experts, output) are
Q8_0, the router and the norms F32. The vocabulary is SmolLM2's (read from
tiny-qwen3.gguf): its first 8192 tokens, with the merges that stay inside them, so the
file stays small (the full vocabulary's strings alone are 1.8 MB); the chat template is
Qwen3's, as there.

The reference is transformers' Qwen3MoeForCausalLM in float32 with every weight replaced by
the GGUF's stored value (the Q8_0 blocks dequantised), eager attention. Per prompt it
records what tests/reference/README.md describes for the tiny models (per-position argmax
and max logit, the last position's top-5, 24 greedy steps with their top-1/top-2
margins) plus, per case, the smallest gap between a routed expert's router logit and the
best unrouted one over every position the reference ran: a routing choice within a
float32 rounding of a tie would make the engine's experts differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parents[1]
VOCAB_SOURCE = ROOT / "tests" / "reference" / "tiny" / "tiny-qwen3.gguf"
NAME = "tiny-qwen3moe.gguf"
SEED = 7
N_VOCAB = 8192
DIMS = dict(
    n_layer=2, d_model=64, n_head=4, n_kv_head=2, head_dim=32, n_expert=8, n_used=2, d_expert=96
)
D_FF_DENSE = 192  # `feed_forward_length`, as the converter writes it (unused: every layer is MoE)
N_GREEDY = 24
# Token ids of the engine's tokenizer (this file's vocabulary): a ChatML turn, a plain
# English sentence, a line of code.
PROMPTS = [
    # "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 363, 403, 198],
    # "The quick brown fox jumps over the lazy dog."
    [504, 2365, 6354, 275, 1324, 544, 6563, 690, 260, 303, 1437, 105, 2767, 30],
    # "def add(a, b):\n    return a + b\n"
    [1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198],
]


def read_vocabulary() -> dict:
    """SmolLM2's tokenizer fields from tiny-qwen3.gguf, cut to the first N_VOCAB tokens."""
    r = gguf.GGUFReader(str(VOCAB_SOURCE))
    f = r.fields

    def strings(key: str) -> list[str]:
        return [bytes(f[key].parts[i]).decode("utf-8") for i in f[key].data]

    tokens = strings("tokenizer.ggml.tokens")[:N_VOCAB]
    types = [
        int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data
    ]
    index = {t: i for i, t in enumerate(tokens)}
    merges = [
        m
        for m in strings("tokenizer.ggml.merges")
        if all(part in index for part in (*m.split(" "), m.replace(" ", "")))
    ]
    template = bytes(f["tokenizer.chat_template"].parts[-1]).decode("utf-8")
    return {"tokens": tokens, "types": types[:N_VOCAB], "merges": merges, "template": template}


def tensor_plan(dims: dict, n_vocab: int) -> list[tuple[str, tuple[int, ...], float | None]]:
    """Every tensor in file order: (GGUF name, numpy shape (out, in) / (E, out, in), scale of
    its random values; None for a norm's weight)."""
    d = dims
    D, Dh, E, F = d["d_model"], d["head_dim"], d["n_expert"], d["d_expert"]
    plan: list[tuple[str, tuple[int, ...], float | None]] = [
        ("token_embd.weight", (n_vocab, D), 8.0)
    ]
    for i in range(d["n_layer"]):
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (D,), None),
            (p + "attn_q.weight", (d["n_head"] * Dh, D), 1.0),
            (p + "attn_k.weight", (d["n_kv_head"] * Dh, D), 1.0),
            (p + "attn_v.weight", (d["n_kv_head"] * Dh, D), 1.0),
            (p + "attn_output.weight", (D, d["n_head"] * Dh), 1.0),
            (p + "attn_q_norm.weight", (Dh,), None),
            (p + "attn_k_norm.weight", (Dh,), None),
            (p + "ffn_norm.weight", (D,), None),
            (p + "ffn_gate_inp.weight", (E, D), 3.0),
            (p + "ffn_gate_exps.weight", (E, F, D), 1.0),
            (p + "ffn_up_exps.weight", (E, F, D), 1.0),
            (p + "ffn_down_exps.weight", (E, D, F), 1.0),
        ]
    return plan + [("output_norm.weight", (D,), None), ("output.weight", (n_vocab, D), 4.0)]


def random_tensor(rng: np.random.Generator, shape: tuple[int, ...], scale: float | None):
    """float32 values: a matrix's scaled by 1/sqrt(fan-in), a norm's weight around 1."""
    if scale is None:
        return (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
    return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)


def random_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """float32 weights by GGUF tensor name, in numpy layout (out, in) / (E, out, in)."""
    return {
        name: random_tensor(rng, shape, scale) for name, shape, scale in tensor_plan(DIMS, N_VOCAB)
    }


def stored_type(name: str, ndim: int) -> Q:
    """How the file stores a tensor: norms and the router F32, matrices Q8_0."""
    if ndim == 1 or name.endswith("ffn_gate_inp.weight"):
        return Q.F32
    return Q.Q8_0


def stored(name: str, array: np.ndarray) -> tuple[np.ndarray, Q]:
    """The tensor as the file stores it (stored_type): values or Q8_0 blocks."""
    if stored_type(name, array.ndim) == Q.F32:
        return array, Q.F32
    return quantize(array, Q.Q8_0), Q.Q8_0


def add_metadata(w: gguf.GGUFWriter, dims: dict, vocab: dict, name: str, d_ff_dense: int):
    """The qwen3moe keys llama.cpp's converter writes, and the vocabulary's."""
    d = dims
    w.add_name(name)
    w.add_block_count(d["n_layer"])
    w.add_context_length(4096)
    w.add_embedding_length(d["d_model"])
    w.add_feed_forward_length(d_ff_dense)
    w.add_head_count(d["n_head"])
    w.add_head_count_kv(d["n_kv_head"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(d["head_dim"])
    w.add_value_length(d["head_dim"])
    w.add_expert_count(d["n_expert"])
    w.add_expert_used_count(d["n_used"])
    w.add_expert_feed_forward_length(d["d_expert"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab["tokens"])
    w.add_token_merges(vocab["merges"])
    w.add_token_types(vocab["types"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(vocab["template"])


def write_gguf(path: Path, weights: dict[str, np.ndarray], vocab: dict) -> dict[str, np.ndarray]:
    """Write the file; returns each tensor's stored value, dequantised (what the engine reads)."""
    w = gguf.GGUFWriter(str(path), arch="qwen3moe")
    add_metadata(w, DIMS, vocab, "tiny-qwen3moe (random weights, test only)", D_FF_DENSE)
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
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    d = DIMS
    config = Qwen3MoeConfig(
        vocab_size=N_VOCAB,
        hidden_size=d["d_model"],
        intermediate_size=D_FF_DENSE,
        moe_intermediate_size=d["d_expert"],
        num_hidden_layers=d["n_layer"],
        num_attention_heads=d["n_head"],
        num_key_value_heads=d["n_kv_head"],
        head_dim=d["head_dim"],
        num_experts=d["n_expert"],
        num_experts_per_tok=d["n_used"],
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    config._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(config).float().eval()
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()}
    state = {
        "model.embed_tokens.weight": t["token_embd.weight"],
        "model.norm.weight": t["output_norm.weight"],
        "lm_head.weight": t["output.weight"],
    }
    for i in range(d["n_layer"]):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        state |= {
            h + "input_layernorm.weight": t[p + "attn_norm.weight"],
            h + "self_attn.q_proj.weight": t[p + "attn_q.weight"],
            h + "self_attn.k_proj.weight": t[p + "attn_k.weight"],
            h + "self_attn.v_proj.weight": t[p + "attn_v.weight"],
            h + "self_attn.o_proj.weight": t[p + "attn_output.weight"],
            h + "self_attn.q_norm.weight": t[p + "attn_q_norm.weight"],
            h + "self_attn.k_norm.weight": t[p + "attn_k_norm.weight"],
            h + "post_attention_layernorm.weight": t[p + "ffn_norm.weight"],
            h + "mlp.gate.weight": t[p + "ffn_gate_inp.weight"],
            h + "mlp.experts.gate_up_proj": torch.cat(
                [t[p + "ffn_gate_exps.weight"], t[p + "ffn_up_exps.weight"]], dim=1
            ),
            h + "mlp.experts.down_proj": t[p + "ffn_down_exps.weight"],
        }
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
        router = layer.mlp.gate
        # The router module returns (logits, weights, indices) in transformers 5; its
        # first output is the logits either way.
        router.register_forward_hook(hook)


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
        layer.mlp.gate._forward_hooks.clear()
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
        "weights": "Q8_0 matrices (experts stacked), F32 router and norms",
        "reference": "transformers Qwen3MoeForCausalLM, float32, eager attention",
        "cases": [run_case(model, p) for p in PROMPTS],
    }
    out = args.out / "tiny_moe_f32.json"
    out.write_text(json.dumps({"models": [entry]}, indent=1) + "\n", "utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes) and {out}")
    for case in entry["cases"]:
        print("min router gap", case["min_router_gap"], "min margin", min(case["top1_top2_margin"]))


if __name__ == "__main__":
    main()
