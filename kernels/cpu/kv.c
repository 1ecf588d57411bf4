/* KV cache rows in float32, float16 or Q8_0 (see kv.h). */
#include "kv.h"

#include <math.h>
#include <string.h>

#include "quants.h"

static int g_kv_isa = ISA_GENERIC;

void kv_set_isa(int isa) { g_kv_isa = isa; }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KV_CLONES
#endif

typedef struct {
    _Float16 d;
    int8_t qs[KV_QK];
} __attribute__((packed)) kv_block_q8;

int64_t kv_row_bytes(int type, int64_t Dh) {
    switch (type) {
    case KV_F16:
        return Dh * (int64_t)sizeof(_Float16);
    case KV_Q8_0:
        return Dh / KV_QK * (int64_t)sizeof(kv_block_q8);
    default:
        return Dh * (int64_t)sizeof(float);
    }
}

KV_CLONES static void store_f16(const float *src, int64_t Dh, _Float16 *dst) {
    for (int64_t d = 0; d < Dh; d++)
        dst[d] = (_Float16)src[d];
}

static void store_q8(const float *src, int64_t Dh, kv_block_q8 *dst) {
    for (int64_t b = 0; b < Dh / KV_QK; b++) {
        const float *x = src + b * KV_QK;
        float amax = 0.f;
        for (int j = 0; j < KV_QK; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.f;
        for (int j = 0; j < KV_QK; j++)
            dst[b].qs[j] = d != 0.f ? (int8_t)roundf(x[j] / d) : 0;
        dst[b].d = (_Float16)d;
    }
}

void kv_store_row(int type, const float *src, int64_t Dh, void *dst) {
    switch (type) {
    case KV_F16:
        store_f16(src, Dh, dst);
        break;
    case KV_Q8_0:
        store_q8(src, Dh, dst);
        break;
    default:
        memcpy(dst, src, (size_t)Dh * sizeof(float));
    }
}

/* The conversions, portable (the compiler does not vectorise _Float16 loads) and with
 * explicit vectors; every version computes each value exactly, so all agree bit for bit. */
static void rows_f16(const _Float16 *src, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

static void rows_q8(const kv_block_q8 *src, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = (float)src[b].d;
        for (int j = 0; j < KV_QK; j++)
            dst[b * KV_QK + j] = d * (float)src[b].qs[j];
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_KV_SIMD 1

__attribute__((target("avx512f,f16c"))) static void rows_f16_avx512(const _Float16 *src, int64_t n,
                                                               float *dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i,
                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    for (; i < n; i++)
        dst[i] = (float)src[i];
}

__attribute__((target("avx2,f16c"))) static void rows_f16_avx2(const _Float16 *src, int64_t n,
                                                               float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = (float)src[i];
}

__attribute__((target("avx512f,f16c"))) static void rows_q8_avx512(const kv_block_q8 *src,
                                                              int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m512 d = _mm512_set1_ps((float)src[b].d);
        for (int h = 0; h < 2; h++) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(src[b].qs + 16 * h));
            const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
            _mm512_storeu_ps(dst + b * KV_QK + 16 * h, _mm512_mul_ps(d, v));
        }
    }
}

__attribute__((target("avx2,f16c"))) static void rows_q8_avx2(const kv_block_q8 *src,
                                                              int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m256 d = _mm256_set1_ps((float)src[b].d);
        for (int e = 0; e < 4; e++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(src[b].qs + 8 * e));
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(dst + b * KV_QK + 8 * e, _mm256_mul_ps(d, v));
        }
    }
}
/* 16 values of a row from column 16 c: float16, or half of Q8_0 block c / 2. */
__attribute__((target("avx512f,f16c"), always_inline)) static inline __m512
chunk16(int type, const uint8_t *row, int64_t c) {
    if (type == KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * c)));
    const kv_block_q8 *b = (const kv_block_q8 *)row + c / 2;
    const __m128i q = _mm_loadu_si128((const __m128i *)(b->qs + 16 * (c % 2)));
    return _mm512_mul_ps(_mm512_set1_ps((float)b->d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

/* Each key's sum: q[0] * k[0..15], then + q[c] * k[16c..] in c order, then one reduce
 * (attention_decode.c's scores_avx512 on the converted values); two keys at a time. */
__attribute__((target("avx512f,f16c,fma"), always_inline)) static inline void
scores_n(int type, const float *qs, const uint8_t *keys, int64_t row, int64_t n,
         const int64_t chunks, float *scores) {
    __m512 q[16];
    for (int64_t c = 0; c < chunks; c++)
        q[c] = _mm512_loadu_ps(qs + 16 * c);
    int64_t t = 0;
    for (; t + 2 <= n; t += 2) {
        const uint8_t *k0 = keys + t * row, *k1 = k0 + row;
        __m512 a0 = _mm512_mul_ps(q[0], chunk16(type, k0, 0));
        __m512 a1 = _mm512_mul_ps(q[0], chunk16(type, k1, 0));
        for (int64_t c = 1; c < chunks; c++) {
            a0 = _mm512_fmadd_ps(q[c], chunk16(type, k0, c), a0);
            a1 = _mm512_fmadd_ps(q[c], chunk16(type, k1, c), a1);
        }
        scores[t] = _mm512_reduce_add_ps(a0);
        scores[t + 1] = _mm512_reduce_add_ps(a1);
    }
    for (; t < n; t++) {
        const uint8_t *k0 = keys + t * row;
        __m512 a0 = _mm512_mul_ps(q[0], chunk16(type, k0, 0));
        for (int64_t c = 1; c < chunks; c++)
            a0 = _mm512_fmadd_ps(q[c], chunk16(type, k0, c), a0);
        scores[t] = _mm512_reduce_add_ps(a0);
    }
}

/* Every 16-wide chunk of the output in its own register; each lane sums p[t] * v[t] in
 * t order (attention_decode.c's weighted_avx512 on the converted values). */
__attribute__((target("avx512f,f16c,fma"), always_inline)) static inline void
weighted_n(int type, const float *w, const uint8_t *values, int64_t row, int64_t n,
           const int64_t chunks, float inv, float *out) {
    __m512 acc[16];
    for (int64_t c = 0; c < chunks; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t++) {
        const __m512 p = _mm512_set1_ps(w[t] * inv);
        const uint8_t *vr = values + t * row;
        for (int64_t c = 0; c < chunks; c++)
            acc[c] = _mm512_fmadd_ps(p, chunk16(type, vr, c), acc[c]);
    }
    for (int64_t c = 0; c < chunks; c++)
        _mm512_storeu_ps(out + 16 * c, acc[c]);
}

__attribute__((target("avx512f,f16c,fma"))) void kv_scores_avx512(int type, const float *qs,
                                                             const void *keys, int64_t n,
                                                             int64_t Dh, float *scores) {
    const int64_t row = kv_row_bytes(type, Dh);
    if (type == KV_F16 && Dh == 64)
        scores_n(KV_F16, qs, keys, row, n, 4, scores);
    else if (type == KV_F16)
        scores_n(KV_F16, qs, keys, row, n, Dh / 16, scores);
    else if (Dh == 64)
        scores_n(KV_Q8_0, qs, keys, row, n, 4, scores);
    else
        scores_n(KV_Q8_0, qs, keys, row, n, Dh / 16, scores);
}

__attribute__((target("avx512f,f16c,fma"))) void kv_weighted_avx512(int type, const float *w,
                                                               const void *values, int64_t n,
                                                               int64_t Dh, float inv,
                                                               float *out) {
    const int64_t row = kv_row_bytes(type, Dh);
    if (type == KV_F16 && Dh == 64)
        weighted_n(KV_F16, w, values, row, n, 4, inv, out);
    else if (type == KV_F16)
        weighted_n(KV_F16, w, values, row, n, Dh / 16, inv, out);
    else if (Dh == 64)
        weighted_n(KV_Q8_0, w, values, row, n, 4, inv, out);
    else
        weighted_n(KV_Q8_0, w, values, row, n, Dh / 16, inv, out);
}
#else
void kv_scores_avx512(int type, const float *qs, const void *keys, int64_t n, int64_t Dh,
                      float *scores) {
    (void)type, (void)qs, (void)keys, (void)n, (void)Dh, (void)scores;
}
void kv_weighted_avx512(int type, const float *w, const void *values, int64_t n, int64_t Dh,
                        float inv, float *out) {
    (void)type, (void)w, (void)values, (void)n, (void)Dh, (void)inv, (void)out;
}
#endif

void kv_rows_f32(int type, const void *rows, int64_t n, int64_t Dh, float *dst) {
    switch (type) {
    case KV_F16:
#ifdef HAVE_KV_SIMD
        if (g_kv_isa == ISA_AVX512) {
            rows_f16_avx512(rows, n * Dh, dst);
            break;
        }
        if (g_kv_isa == ISA_AVX2) {
            rows_f16_avx2(rows, n * Dh, dst);
            break;
        }
#endif
        rows_f16(rows, n * Dh, dst);
        break;
    case KV_Q8_0:
#ifdef HAVE_KV_SIMD
        if (g_kv_isa == ISA_AVX512) {
            rows_q8_avx512(rows, n * (Dh / KV_QK), dst);
            break;
        }
        if (g_kv_isa == ISA_AVX2) {
            rows_q8_avx2(rows, n * (Dh / KV_QK), dst);
            break;
        }
#endif
        rows_q8(rows, n * (Dh / KV_QK), dst);
        break;
    default:
        memcpy(dst, rows, (size_t)(n * Dh) * sizeof(float));
    }
}
