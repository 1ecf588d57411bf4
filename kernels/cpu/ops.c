/* Decode-step ops: attention over the KV cache, RMS norm, RoPE (see ops.h). */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define LANES 16

/* sum_i a[i] * b[i] over LANES partial sums, added in lane order at the end. */
static inline float dot(const float *a, const float *b, int64_t n) {
    float acc[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = 0.f;
    for (int l = 0; l < LANES; l++)
        s += acc[l];
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One query head over positions [lo, hi] of its KV head: keys/values (n_ctx, Dh). */
static void attend_head(const float *q, const float *keys, const float *values, int64_t lo,
                        int64_t hi, int64_t Dh, float scale, float softcap, float *scores,
                        float *qs, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        qs[d] = q[d] * scale;
    const int64_t n = hi - lo + 1;
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        float s = dot(qs, keys + (lo + t) * Dh, Dh);
        if (softcap > 0.f)
            s = softcap * tanhf(s / softcap);
        scores[t] = s;
        if (s > mx)
            mx = s;
    }
    float lanes[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES)
        for (int l = 0; l < LANES; l++) {
            const float e = expf(scores[t + l] - mx);
            scores[t + l] = e;
            lanes[l] += e;
        }
    float sum = 0.f;
    for (int l = 0; l < LANES; l++)
        sum += lanes[l];
    for (; t < n; t++) {
        const float e = expf(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    for (int64_t d = 0; d < Dh; d++)
        out[d] = 0.f;
    for (t = 0; t < n; t++) {
        const float p = scores[t] / sum;
        const float *vr = values + (lo + t) * Dh;
        for (int64_t d = 0; d < Dh; d++)
            out[d] += p * vr[d];
    }
}

typedef struct {
    const float *q, *kcache, *vcache;
    int64_t n_slots, head_stride, layer_base, H, Hkv, Dh, window;
    const int64_t *slots, *positions;
    float scale, softcap;
    float *out;
} attn_job;

static void attn_one(void *ctx, int64_t j) {
    const attn_job *a = ctx;
    const int64_t b = j / a->H, h = j % a->H, p = a->positions[b];
    const int64_t lo = a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
    const int64_t base =
        a->layer_base + (a->slots[b] * a->Hkv + h / (a->H / a->Hkv)) * a->head_stride;
    float stack[4096];
    const int64_t need = (p - lo + 1) + a->Dh;
    float *scratch = need <= 4096 ? stack : malloc((size_t)need * sizeof(float));
    if (scratch == NULL)
        return; /* out of memory: leaves this head's output as it was */
    attend_head(a->q + (b * a->H + h) * a->Dh, a->kcache + base, a->vcache + base, lo, p, a->Dh,
                a->scale, a->softcap, scratch + a->Dh, scratch, a->out + (b * a->H + h) * a->Dh);
    if (scratch != stack)
        free(scratch);
}

void cpu_attention_decode(int nthreads, const float *q, const float *k, const float *v,
                          float *kcache, float *vcache, int64_t n_slots, int64_t n_ctx,
                          int64_t layer, const int64_t *slots, const int64_t *positions,
                          int64_t B, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                          int64_t window, float softcap, float *out) {
    const int64_t head_stride = n_ctx * Dh;
    const int64_t layer_base = layer * n_slots * Hkv * head_stride;
    int64_t longest = 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t p = positions[b];
        if (p + 1 > longest)
            longest = p + 1;
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t at = layer_base + (slots[b] * Hkv + h) * head_stride + p * Dh;
            memcpy(kcache + at, k + (b * Hkv + h) * Dh, (size_t)Dh * sizeof(float));
            memcpy(vcache + at, v + (b * Hkv + h) * Dh, (size_t)Dh * sizeof(float));
        }
    }
    attn_job job = {q,     kcache,  vcache,    n_slots, head_stride, layer_base, H, Hkv, Dh,
                    window, slots, positions, scale,   softcap,     out};
    const int nt = (double)B * (double)H * (double)longest * (double)Dh < 32768.0 ? 1 : nthreads;
    pool_run(nt, B * H, attn_one, &job);
}

void cpu_rms_norm(int nthreads, const float *x, const float *w, float eps, int64_t n, int64_t D,
                  float *out) {
    (void)nthreads; /* a decode step's few rows: not worth handing out */
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * D;
        double acc[LANES] = {0};
        int64_t d = 0;
        for (; d + LANES <= D; d += LANES)
            for (int l = 0; l < LANES; l++)
                acc[l] += (double)(xr[d + l] * xr[d + l]);
        double s = 0.0;
        for (int l = 0; l < LANES; l++)
            s += acc[l];
        for (; d < D; d++)
            s += (double)(xr[d] * xr[d]);
        const float ms = (float)s / (float)D;
        const float r = 1.0f / sqrtf(ms + eps);
        float *o = out + i * D;
        for (d = 0; d < D; d++)
            o[d] = xr[d] * r * w[d];
    }
}

void cpu_rope(int nthreads, float *x, const int64_t *positions, const float *cos_t,
              const float *sin_t, int64_t n, int64_t H, int64_t Dh, int neox) {
    const int64_t half = Dh / 2;
    (void)nthreads;
    for (int64_t i = 0; i < n; i++) {
        const float *c = cos_t + positions[i] * half, *s = sin_t + positions[i] * half;
        for (int64_t h = 0; h < H; h++) {
            float *xr = x + (i * H + h) * Dh;
            if (neox) {
                for (int64_t j = 0; j < half; j++) {
                    const float x0 = xr[j], x1 = xr[j + half];
                    xr[j] = x0 * c[j] - x1 * s[j];
                    xr[j + half] = x0 * s[j] + x1 * c[j];
                }
            } else {
                for (int64_t j = 0; j < half; j++) {
                    const float x0 = xr[2 * j], x1 = xr[2 * j + 1];
                    xr[2 * j] = x0 * c[j] - x1 * s[j];
                    xr[2 * j + 1] = x0 * s[j] + x1 * c[j];
                }
            }
        }
    }
}
