/* Decode-step ops: attention over the KV cache, RMS norm, RoPE (see ops.h). */
#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define LANES 16

/* Attention is written as plain loops the compiler vectorises, compiled once per ISA
 * (target_clones: AVX-512, AVX2, baseline x86-64; chosen by the loader) so one binary runs
 * everywhere and each CPU gets its widest vectors. The exponential is a polynomial the
 * loop can vectorise (libm's expf is a scalar call per score, which dominated: 9 heads x
 * 2000 positions of expf cost 0.4 ms a layer). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ISA_CLONES
#endif

/* e^x for x <= 0 (a softmax's shifted scores): x = n ln2 + r, |r| <= ln2 / 2, e^r by a
 * degree-6 polynomial (relative error ~2e-7), 2^n built in the exponent bits. Below
 * -87.3 the result is 0 (float's smallest normal is e^-87.3). */
static inline float exp_nonpositive(float x) {
    const float clamped = x < -87.3f ? -87.3f : x;
    const float t = clamped * 1.44269504f;
    const float n = (float)(int32_t)(t - 0.5f); /* round half down; t <= 0 */
    const float r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.3981999e-3f;
    p = p * r + 8.3334519e-3f;
    p = p * r + 4.1665795e-2f;
    p = p * r + 1.6666665e-1f;
    p = p * r + 5.0000001e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    const float e = p * scale.f;
    return x < -87.3f ? 0.f : e;
}

/* Scores of one query (pre-scaled) against n keys (n, Dh): each a sum over LANES
 * partial sums added in lane order. */
ISA_CLONES static void scores_of(const float *qs, const float *keys, int64_t n, int64_t Dh,
                                 float *scores) {
    for (int64_t t = 0; t < n; t++) {
        const float *kr = keys + t * Dh;
        float acc[LANES] = {0};
        int64_t d = 0;
        for (; d + LANES <= Dh; d += LANES)
            for (int l = 0; l < LANES; l++)
                acc[l] += qs[d + l] * kr[d + l];
        /* A fixed tree (halves added lane-wise), not a serial chain of 15 adds. */
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int l = 0; l < w; l++)
                acc[l] += acc[l + w];
        float s = acc[0];
        for (; d < Dh; d++)
            s += qs[d] * kr[d];
        scores[t] = s;
    }
}

/* scores[t] = e^(scores[t] - mx) in place; returns their sum (LANES partial sums). */
ISA_CLONES static float exp_and_sum(float *scores, int64_t n, float mx) {
    float lanes[LANES] = {0};
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES)
        for (int l = 0; l < LANES; l++) {
            const float e = exp_nonpositive(scores[t + l] - mx);
            scores[t + l] = e;
            lanes[l] += e;
        }
    float sum = 0.f;
    for (int l = 0; l < LANES; l++)
        sum += lanes[l];
    for (; t < n; t++) {
        const float e = exp_nonpositive(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    return sum;
}

/* out = sum_t w[t] * values[t] / sum. */
ISA_CLONES static void weighted_values(const float *w, const float *values, int64_t n,
                                       int64_t Dh, float sum, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        out[d] = 0.f;
    const float inv = 1.0f / sum;
    for (int64_t t = 0; t < n; t++) {
        const float p = w[t] * inv;
        const float *vr = values + t * Dh;
        for (int64_t d = 0; d < Dh; d++)
            out[d] += p * vr[d];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX512_ATTENTION 1

/* AVX-512 bodies of scores_of / weighted_values for Dh a multiple of 16 (every model we
 * know: 64, 128, 256): the reduction stays in registers (the loop versions spill the
 * lanes to the stack and reload them, ~12 ns a key). */
__attribute__((target("avx512f,fma"))) static void scores_avx512(const float *qs,
                                                                const float *keys, int64_t n,
                                                                int64_t Dh, float *scores) {
    __m512 q[16];
    const int64_t chunks = Dh / 16;
    for (int64_t c = 0; c < chunks && c < 16; c++)
        q[c] = _mm512_loadu_ps(qs + 16 * c);
    for (int64_t t = 0; t < n; t++) {
        const float *kr = keys + t * Dh;
        __m512 acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(kr));
        for (int64_t c = 1; c < chunks; c++)
            acc = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kr + 16 * c), acc);
        scores[t] = _mm512_reduce_add_ps(acc);
    }
}

__attribute__((target("avx512f,fma"))) static void weighted_avx512(const float *w,
                                                                  const float *values,
                                                                  int64_t n, int64_t Dh,
                                                                  float sum, float *out) {
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < Dh / 16; c++) {
        __m512 acc = _mm512_setzero_ps();
        const float *vc = values + 16 * c;
        for (int64_t t = 0; t < n; t++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(w[t] * inv), _mm512_loadu_ps(vc + t * Dh), acc);
        _mm512_storeu_ps(out + 16 * c, acc);
    }
}

static int use_avx512_attention(int64_t Dh) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        const char *forced = getenv("PANTHEON_CPU_ISA");
        has = __builtin_cpu_supports("avx512f") && !(forced && strcmp(forced, "avx512") != 0);
    }
    return has && Dh % 16 == 0 && Dh <= 256;
}
#endif

/* One query head over positions [lo, hi] of its KV head: keys/values (n_ctx, Dh). */
static void attend_head(const float *q, const float *keys, const float *values, int64_t lo,
                        int64_t hi, int64_t Dh, float scale, float softcap, float *scores,
                        float *qs, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        qs[d] = q[d] * scale;
    const int64_t n = hi - lo + 1;
#ifdef HAVE_AVX512_ATTENTION
    const int wide = use_avx512_attention(Dh);
#else
    const int wide = 0;
#endif
#ifdef HAVE_AVX512_ATTENTION
    if (wide)
        scores_avx512(qs, keys + lo * Dh, n, Dh, scores);
    else
#endif
        scores_of(qs, keys + lo * Dh, n, Dh, scores);
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        if (softcap > 0.f)
            scores[t] = softcap * tanhf(scores[t] / softcap);
        if (scores[t] > mx)
            mx = scores[t];
    }
    const float sum = exp_and_sum(scores, n, mx);
#ifdef HAVE_AVX512_ATTENTION
    if (wide) {
        weighted_avx512(scores, values + lo * Dh, n, Dh, sum, out);
        return;
    }
#endif
    (void)wide;
    weighted_values(scores, values + lo * Dh, n, Dh, sum, out);
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
