/* See decode.h. The step is the per-op path of kernels/cpu_backend.py written out in C:
 * the same kernels (cpu_linear, cpu_rms_norm, cpu_rope, cpu_attention_decode, cpu_glu)
 * on the same buffers in the same order, so it changes no bit; what it removes is the
 * Python between them (~12 calls, their argument checks and numpy temporaries per layer)
 * and the GIL hand-offs each call made. */
#include "decode.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mixture.h"
#include "ops.h"
#include "quants.h"
#include "scratch.h"

void dec_matmul(int isa, int nt, const dec_matrix *m, const float *x, int64_t B, float *out) {
    cpu_linear_parts(isa, nt, m->n_parts, m->part, m->K, x, B, out, m->N);
}

int cpu_decode_layers(int isa, int nt, const dec_model *m, float *x, int64_t B,
                      const int64_t *slots, const int64_t *positions, const kv_cache *kv) {
    const int64_t D = m->D, H = m->H, Hkv = m->Hkv, Dh = m->Dh, F = m->F;
    const int64_t Dq = H * Dh, Dkv = Hkv * Dh, Nqkv = Dq + 2 * Dkv;
    /* One allocation for the step's temporaries. */
    const int64_t per_row = D /* h */ + Nqkv + Dq /* q */ + 2 * Dkv /* k, v */ +
                            Dq /* attention */ + D /* out */ + 2 * F + F;
    float *buf = scratch_take(SCRATCH_DECODE, (size_t)(per_row * B) * sizeof(float));
    if (buf == NULL)
        return -1;
    float *h = buf, *qkv = h + B * D, *q = qkv + B * Nqkv, *k = q + B * Dq, *v = k + B * Dkv;
    float *attn = v + B * Dkv, *out = attn + B * Dq, *gu = out + B * D, *g = gu + B * 2 * F;

    for (int li = 0; li < m->n_layer; li++) {
        const dec_layer *L = &m->layers[li];
        cpu_rms_norm(nt, x, L->attn_norm, m->eps, B, D, h);
        dec_matmul(isa, nt, &L->qkv, h, B, qkv);
        for (int64_t b = 0; b < B; b++) {
            float *row = qkv + b * Nqkv;
            if (L->qkv_bias)
                for (int64_t j = 0; j < Nqkv; j++)
                    row[j] += L->qkv_bias[j];
            memcpy(q + b * Dq, row, (size_t)Dq * sizeof(float));
            memcpy(k + b * Dkv, row + Dq, (size_t)Dkv * sizeof(float));
            memcpy(v + b * Dkv, row + Dq + Dkv, (size_t)Dkv * sizeof(float));
        }
        if (L->q_norm) { /* per head, in place: each row is read before it is written */
            cpu_rms_norm(nt, q, L->q_norm, m->eps, B * H, Dh, q);
            cpu_rms_norm(nt, k, L->k_norm, m->eps, B * Hkv, Dh, k);
        }
        cpu_rope(nt, q, positions, L->cos, L->sin, B, H, Dh, m->neox);
        cpu_rope(nt, k, positions, L->cos, L->sin, B, Hkv, Dh, m->neox);
        cpu_attention_decode(nt, q, k, v, kv, li, slots, positions, B, H, Hkv, Dh, m->scale,
                             L->window, m->softcap, NULL, attn);
        dec_matmul(isa, nt, &L->out, attn, B, out);
        if (L->post_attention_norm)
            cpu_rms_norm(nt, out, L->post_attention_norm, m->eps, B, D, out);
        for (int64_t i = 0; i < B * D; i++)
            x[i] = x[i] + out[i];

        cpu_rms_norm(nt, x, L->ffn_norm, m->eps, B, D, h);
        if (L->moe != NULL) {
            if (cpu_moe_ffn(isa, nt, L->moe, m->act, h, B, D, out) != 0) {
                scratch_give_back(SCRATCH_DECODE, buf);
                return -1;
            }
        } else {
            dec_matmul(isa, nt, &L->gate_up, h, B, gu);
            cpu_glu(gu, B, F, m->act, g);
            dec_matmul(isa, nt, &L->down, g, B, out);
        }
        if (L->post_ffw_norm)
            cpu_rms_norm(nt, out, L->post_ffw_norm, m->eps, B, D, out);
        for (int64_t i = 0; i < B * D; i++)
            x[i] = x[i] + out[i];
    }
    scratch_give_back(SCRATCH_DECODE, buf);
    return 0;
}
