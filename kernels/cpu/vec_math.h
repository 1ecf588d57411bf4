/* Float32 math the decode-step ops share (attention_decode.c, attention_prefill.c, ops.c):
 * the exponential of a softmax's shifted scores, the softmax's sum, attention sinks, and
 * their AVX-512 twins, which do the same operations in the same order (the same bits).
 * Static: each file gets its own copy, so the compiler inlines them into its loops. */
#ifndef PANTHEON_CPU_VEC_MATH_H
#define PANTHEON_CPU_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* scores[t] = e^(scores[t] - mx) in place; returns their sum (LANES partial sums). */
ISA_CLONES static __attribute__((unused)) float exp_and_sum(float *scores, int64_t n, float mx) {
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

/* Attention sinks (gpt-oss): a logit per query head that joins the softmax's max and its
 * denominator and takes no value; -INFINITY for none, which leaves every bit as it was. */
static inline float with_sink_max(float mx, float sink) { return sink > mx ? sink : mx; }

static inline float with_sink_sum(float sum, float sink, float mx) {
    return sink == -INFINITY ? sum : sum + exp_nonpositive(sink - mx);
}

static inline float sink_of(const float *sinks, int64_t h) {
    return sinks != NULL ? sinks[h] : -INFINITY;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX512_ATTENTION 1

/* exp_nonpositive on 16 lanes: the same operations in the same order, so the same bits. */
__attribute__((target("avx512f,fma"), always_inline)) static inline __m512
exp_nonpositive_avx512(__m512 x) {
    const __m512 lowest = _mm512_set1_ps(-87.3f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
    const __m512 clamped = _mm512_mask_blend_ps(under, x, lowest);
    const __m512 tt = _mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504f));
    const __m512i ni = _mm512_cvttps_epi32(_mm512_sub_ps(tt, _mm512_set1_ps(0.5f)));
    const __m512 nf = _mm512_cvtepi32_ps(ni);
    const __m512 r =
        _mm512_add_ps(_mm512_sub_ps(clamped, _mm512_mul_ps(nf, _mm512_set1_ps(0.693359375f))),
                      _mm512_mul_ps(nf, _mm512_set1_ps(2.12194440e-4f)));
    __m512 p = _mm512_set1_ps(1.3981999e-3f);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(8.3334519e-3f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(4.1665795e-2f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.6666665e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(5.0000001e-1f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    const __m512i bits =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(nf), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(p, _mm512_castsi512_ps(bits)));
}

__attribute__((target("avx512f,fma"), unused)) static float exp_and_sum_avx512(float *scores,
                                                                      int64_t n, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 lanes = _mm512_setzero_ps();
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES) {
        const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_loadu_ps(scores + t), vmx));
        _mm512_storeu_ps(scores + t, e);
        lanes = _mm512_add_ps(lanes, e);
    }
    float part[LANES];
    _mm512_storeu_ps(part, lanes);
    float sum = 0.f;
    for (int l = 0; l < LANES; l++)
        sum += part[l];
    for (; t < n; t++) {
        const float e = exp_nonpositive(scores[t] - mx);
        scores[t] = e;
        sum += e;
    }
    return sum;
}

static __attribute__((unused)) int use_avx512_attention(int64_t Dh) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        const char *forced = getenv("PANTHEON_CPU_ISA");
        has = __builtin_cpu_supports("avx512f") && !(forced && strcmp(forced, "avx512") != 0);
    }
    return has && Dh % 16 == 0 && Dh <= 256;
}
#endif

/* Whether the AVX-512 bodies may run for rows of Dh floats: use_avx512_attention where
 * they are compiled, 0 where not. */
static inline int avx512_rows(int64_t Dh) {
#ifdef HAVE_AVX512_ATTENTION
    return use_avx512_attention(Dh);
#else
    (void)Dh;
    return 0;
#endif
}

#endif
