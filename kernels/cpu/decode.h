/* A whole decode step of a decoder stack in one call: every layer's norms, products,
 * RoPE, attention over the KV cache and FFN for B rows, with no Python between the ops.
 * It calls the same kernels, in the same order, on the same values as the per-op path
 * (kernels/cpu_backend.py), so its bits are that path's bits: batch and thread invariant. */
#ifndef PANTHEON_CPU_DECODE_H
#define PANTHEON_CPU_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "kv.h"
#include "quants.h"

#define DECODE_MAX_PARTS 4

/* A matrix in GGUF blocks, possibly stacked from parts along its output rows (q/k/v,
 * gate/up), each part kept where the file maps it. */
typedef linear_part dec_part;

typedef struct {
    int n_parts;
    dec_part part[DECODE_MAX_PARTS];
    int64_t N, K;
} dec_matrix;

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

/* A mixture-of-experts FFN (mixture.h): a router and E experts, each expert's matrices
 * parts of the file's stacked tensors (views, never copies). */
typedef struct {
    int64_t E, k, F;                /* experts, chosen per row, an expert's width */
    int gating, norm_topk;          /* GATE_* (mixture.h) */
    float scale;                    /* the chosen weights times this */
    dec_matrix router;              /* (E, D) */
    const float *router_bias;       /* (E,) or NULL */
    dec_matrix *gate_up, *down;     /* E each: (2F, D), (D, F) */
    int64_t Fs;                     /* the shared expert's width; 0: none */
    dec_matrix shared_gate_up, shared_down;
} dec_moe;

typedef struct {
    const float *attn_norm, *ffn_norm;             /* (D,) */
    const float *qkv_bias;                         /* (Dq + 2 Dkv,) or NULL */
    const float *q_norm, *k_norm;                  /* (Dh,) or NULL (both or neither) */
    const float *post_attention_norm, *post_ffw_norm; /* (D,) or NULL */
    const float *cos, *sin;                        /* (n_pos, Dh / 2) */
    int64_t n_pos;
    int64_t window;                                /* > 0: sliding-window layer */
    dec_matrix qkv, out, gate_up, down; /* gate_up, down: unused where moe is set */
    const dec_moe *moe;                  /* the FFN is a mixture of experts, or NULL */
} dec_layer;

typedef struct {
    int n_layer;
    dec_layer *layers;
    int64_t D, H, Hkv, Dh, F;
    float eps, scale, softcap;
    int neox, act;
} dec_model;

/* x (B, D) in place through every layer; row b at positions[b] of slots[b], its k/v
 * written into the cache `kv` (kv.h: rows of its KV type). Returns 0, or -1 when scratch
 * memory could not be allocated (x is then partly updated). */
int cpu_decode_layers(int isa, int nthreads, const dec_model *m, float *x, int64_t B,
                      const int64_t *slots, const int64_t *positions, const kv_cache *kv);

/* out (B, N) = x (B, K) @ m.T, part by part (cpu_linear). */
void dec_matmul(int isa, int nthreads, const dec_matrix *m, const float *x, int64_t B,
                float *out);

/* out (n, F) = act(gate_up[:, :F]) * gate_up[:, F:], gate_up (n, 2F). */
void cpu_glu(const float *gate_up, int64_t n, int64_t F, int act, float *out);

#endif
