/* Decode-step ops besides attention (attention_decode.c, attention_prefill.c): the gated
 * FFN's activation, RMS norm, RoPE (see ops.h, decode.h). */
#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "vec_math.h"

/* The gated FFN's activation times up, elementwise: a loop the compiler vectorises (libm's
 * expf / tanhf are a scalar call per element: at B = 8 a SmolLM2 step's 368k of them were
 * ~6 % of the step). Both use exp_nonpositive on -|.|, so nothing overflows:
 *   silu(g) = g / (1 + e) for g >= 0, g e / (1 + e) below, e = exp(-|g|)
 *   1 + tanh(y) = 2 / (1 + e) for y >= 0, 2 e / (1 + e) below, e = exp(-2|y|)
 * (the second never forms 1 + tanh(y) from a rounded tanh, which cancels for y < -2).
 * Per element, so a row's bits never depend on the batch; the per-op path and the fused
 * step call this same function. */
ISA_CLONES static void glu_silu(const float *g, const float *u, float *o, int64_t F) {
    for (int64_t j = 0; j < F; j++) {
        const float x = g[j], e = exp_nonpositive(-fabsf(x));
        const float xe = x * e; /* both sides computed, then one select: vectorises */
        o[j] = ((x >= 0.f ? x : xe) / (1.0f + e)) * u[j];
    }
}

ISA_CLONES static void glu_gelu_tanh(const float *g, const float *u, float *o, int64_t F) {
    for (int64_t j = 0; j < F; j++) {
        const float x = g[j];
        const float y = 0.7978845608f * (x + 0.044715f * (x * x * x));
        const float e = exp_nonpositive(-2.0f * fabsf(y));
        const float e2 = 2.0f * e;
        const float one_plus_t = (y >= 0.f ? 2.0f : e2) / (1.0f + e);
        o[j] = 0.5f * x * one_plus_t * u[j];
    }
}

#ifdef HAVE_AVX512_ATTENTION
/* -|x|: the sign bit set, as -fabsf(x) does. */
__attribute__((target("avx512f"), always_inline)) static inline __m512 neg_abs_avx512(__m512 x) {
    return _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}

/* glu_silu / glu_gelu_tanh's operations on 16 lanes (same bits), the tail by them. */
__attribute__((target("avx512f,fma"))) static void glu_silu_avx512(const float *g,
                                                                   const float *u, float *o,
                                                                   int64_t F) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= F; j += 16) {
        const __m512 x = _mm512_loadu_ps(g + j);
        const __m512 e = exp_nonpositive_avx512(neg_abs_avx512(x));
        const __mmask16 pos = _mm512_cmp_ps_mask(x, zero, _CMP_GE_OQ);
        const __m512 num = _mm512_mask_blend_ps(pos, _mm512_mul_ps(x, e), x);
        const __m512 s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        _mm512_storeu_ps(o + j, _mm512_mul_ps(s, _mm512_loadu_ps(u + j)));
    }
    glu_silu(g + j, u + j, o + j, F - j);
}

__attribute__((target("avx512f,fma"))) static void glu_gelu_tanh_avx512(const float *g,
                                                                        const float *u,
                                                                        float *o, int64_t F) {
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f),
                 zero = _mm512_setzero_ps(), half = _mm512_set1_ps(0.5f);
    int64_t j = 0;
    for (; j + 16 <= F; j += 16) {
        const __m512 x = _mm512_loadu_ps(g + j);
        const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        const __m512 y = _mm512_mul_ps(
            _mm512_set1_ps(0.7978845608f),
            _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(0.044715f), cube)));
        const __m512 e = exp_nonpositive_avx512(_mm512_mul_ps(_mm512_set1_ps(-2.0f),
                                                              _mm512_abs_ps(y)));
        const __mmask16 pos = _mm512_cmp_ps_mask(y, zero, _CMP_GE_OQ);
        const __m512 num = _mm512_mask_blend_ps(pos, _mm512_mul_ps(two, e), two);
        const __m512 opt = _mm512_div_ps(num, _mm512_add_ps(one, e));
        const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(half, x), opt),
                                       _mm512_loadu_ps(u + j));
        _mm512_storeu_ps(o + j, r);
    }
    glu_gelu_tanh(g + j, u + j, o + j, F - j);
}
#endif

void cpu_glu(const float *gate_up, int64_t n, int64_t F, int act, float *out) {
    const int wide = avx512_rows(16);
    for (int64_t i = 0; i < n; i++) {
        const float *g = gate_up + i * 2 * F;
#ifdef HAVE_AVX512_ATTENTION
        if (wide) {
            if (act == ACT_GELU_TANH)
                glu_gelu_tanh_avx512(g, g + F, out + i * F, F);
            else
                glu_silu_avx512(g, g + F, out + i * F, F);
            continue;
        }
#endif
        (void)wide;
        if (act == ACT_GELU_TANH)
            glu_gelu_tanh(g, g + F, out + i * F, F);
        else
            glu_silu(g, g + F, out + i * F, F);
    }
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
