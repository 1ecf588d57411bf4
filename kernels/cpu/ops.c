/* Decode-step ops: attention over the KV cache, RMS norm, RoPE (see ops.h). */
#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
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

/* Attention sinks (gpt-oss): a logit per query head that joins the softmax's max and its
 * denominator and takes no value; -INFINITY for none, which leaves every bit as it was. */
static inline float with_sink_max(float mx, float sink) { return sink > mx ? sink : mx; }

static inline float with_sink_sum(float sum, float sink, float mx) {
    return sink == -INFINITY ? sum : sum + exp_nonpositive(sink - mx);
}

static inline float sink_of(const float *sinks, int64_t h) {
    return sinks != NULL ? sinks[h] : -INFINITY;
}

/* Soft-capping in place (softcap > 0), then the largest score joined with the sink: the
 * softmax's max as decode attention takes it (a NaN score is skipped, as `s > mx` does). */
static float capped_max(float *scores, int64_t n, float softcap, float sink) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        if (softcap > 0.f)
            scores[t] = softcap * tanhf(scores[t] / softcap);
        if (scores[t] > mx)
            mx = scores[t];
    }
    return with_sink_max(mx, sink);
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
/* Four keys at a time (independent FMA chains); each key's sum is still q[0] * k[0..15],
 * then + q[c] * k[16c..] in c order, then one reduce: the one-key-at-a-time bits. */
__attribute__((target("avx512f,fma"))) static inline __attribute__((always_inline)) void
scores_avx512_n(const float *qs, const float *keys, int64_t n, const int64_t chunks,
                float *scores) {
    const int64_t Dh = chunks * 16;
    __m512 q[16];
    for (int64_t c = 0; c < chunks; c++)
        q[c] = _mm512_loadu_ps(qs + 16 * c);
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        const float *k0 = keys + t * Dh;
        __m512 a0 = _mm512_mul_ps(q[0], _mm512_loadu_ps(k0));
        __m512 a1 = _mm512_mul_ps(q[0], _mm512_loadu_ps(k0 + Dh));
        __m512 a2 = _mm512_mul_ps(q[0], _mm512_loadu_ps(k0 + 2 * Dh));
        __m512 a3 = _mm512_mul_ps(q[0], _mm512_loadu_ps(k0 + 3 * Dh));
        for (int64_t c = 1; c < chunks; c++) {
            a0 = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k0 + 16 * c), a0);
            a1 = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k0 + Dh + 16 * c), a1);
            a2 = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k0 + 2 * Dh + 16 * c), a2);
            a3 = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k0 + 3 * Dh + 16 * c), a3);
        }
        scores[t] = _mm512_reduce_add_ps(a0);
        scores[t + 1] = _mm512_reduce_add_ps(a1);
        scores[t + 2] = _mm512_reduce_add_ps(a2);
        scores[t + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; t < n; t++) {
        const float *kr = keys + t * Dh;
        __m512 acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(kr));
        for (int64_t c = 1; c < chunks; c++)
            acc = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(kr + 16 * c), acc);
        scores[t] = _mm512_reduce_add_ps(acc);
    }
}

__attribute__((target("avx512f,fma"))) static void scores_avx512(const float *qs,
                                                                const float *keys, int64_t n,
                                                                int64_t Dh, float *scores) {
    switch (Dh) { /* constant chunk counts: the accumulators stay in registers */
    case 64:
        scores_avx512_n(qs, keys, n, 4, scores);
        break;
    case 128:
        scores_avx512_n(qs, keys, n, 8, scores);
        break;
    default:
        scores_avx512_n(qs, keys, n, Dh / 16, scores);
    }
}

/* out += sum_t (w[t] * inv) * values[t]. Every 16-wide chunk of the output accumulates in
 * its own register, all chunks in the inner loop (independent chains, not one chain of n
 * FMAs per chunk); each output lane still sums p[t] * v[t] in t order: the
 * chunk-at-a-time bits. The accumulators start from `out` (storing and reloading a float
 * rounds nothing), so a range of keys may be done a tile at a time. */
__attribute__((target("avx512f,fma"))) static inline __attribute__((always_inline)) void
weighted_more_avx512_n(const float *w, const float *values, int64_t n, const int64_t chunks,
                       float inv, float *out) {
    const int64_t Dh = chunks * 16;
    __m512 acc[16];
    for (int64_t c = 0; c < chunks; c++)
        acc[c] = _mm512_loadu_ps(out + 16 * c);
    for (int64_t t = 0; t < n; t++) {
        const __m512 p = _mm512_set1_ps(w[t] * inv);
        const float *vr = values + t * Dh;
        for (int64_t c = 0; c < chunks; c++)
            acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + 16 * c), acc[c]);
    }
    for (int64_t c = 0; c < chunks; c++)
        _mm512_storeu_ps(out + 16 * c, acc[c]);
}

__attribute__((target("avx512f,fma"))) static void
weighted_more_avx512(const float *w, const float *values, int64_t n, int64_t Dh, float inv,
                     float *out) {
    switch (Dh) {
    case 64:
        weighted_more_avx512_n(w, values, n, 4, inv, out);
        break;
    case 128:
        weighted_more_avx512_n(w, values, n, 8, inv, out);
        break;
    case 256:
        weighted_more_avx512_n(w, values, n, 16, inv, out);
        break;
    default:
        weighted_more_avx512_n(w, values, n, Dh / 16, inv, out);
    }
}

/* out = sum_t (w[t] / sum) * values[t], as p[t] = w[t] * (1 / sum). */
__attribute__((target("avx512f,fma"))) static void weighted_avx512(const float *w,
                                                                  const float *values,
                                                                  int64_t n, int64_t Dh,
                                                                  float sum, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        out[d] = 0.f;
    weighted_more_avx512(w, values, n, Dh, 1.0f / sum, out);
}

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

__attribute__((target("avx512f,fma"))) static float exp_and_sum_avx512(float *scores,
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

/* The largest of n scores (NaNs skipped, as the loop `if (s > mx) mx = s` does). */
__attribute__((target("avx512f,fma"))) static float max_avx512(const float *s, int64_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 16 <= n; t += 16)
        m = _mm512_max_ps(_mm512_loadu_ps(s + t), m); /* a NaN score keeps m */
    float mx = _mm512_reduce_max_ps(m);
    for (; t < n; t++)
        if (s[t] > mx)
            mx = s[t];
    return mx;
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

void cpu_glu(const float *gate_up, int64_t n, int64_t F, int act, float *out) {
#ifdef HAVE_AVX512_ATTENTION
    const int wide = use_avx512_attention(16);
#else
    const int wide = 0;
#endif
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

/* One query head over positions [lo, hi] of its KV head: keys/values (n_ctx, Dh). */
static void attend_head(const float *q, const float *keys, const float *values, int64_t lo,
                        int64_t hi, int64_t Dh, float scale, float softcap, float sink,
                        float *scores, float *qs, float *out) {
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
    const float mx = capped_max(scores, n, softcap, sink);
#ifdef HAVE_AVX512_ATTENTION
    if (wide) {
        const float sum = exp_and_sum_avx512(scores, n, mx); /* exp_and_sum's bits */
        weighted_avx512(scores, values + lo * Dh, n, Dh, with_sink_sum(sum, sink, mx), out);
        return;
    }
#endif
    (void)wide;
    const float sum = with_sink_sum(exp_and_sum(scores, n, mx), sink, mx);
    weighted_values(scores, values + lo * Dh, n, Dh, sum, out);
}

/* out += sum_t (w[t] * inv) * values[t]: weighted_values' sums continued over a tile of
 * keys (each output lane still adds its terms in t order). */
ISA_CLONES static void weighted_more(const float *w, const float *values, int64_t n,
                                     int64_t Dh, float inv, float *out) {
    for (int64_t t = 0; t < n; t++) {
        const float p = w[t] * inv;
        const float *vr = values + t * Dh;
        for (int64_t d = 0; d < Dh; d++)
            out[d] += p * vr[d];
    }
}

/* Rows of a narrow cache converted per tile: KV_TILE_FLOATS float32 values at a time. */
#define KV_TILE_FLOATS 2048

static int64_t kv_tile_rows(int64_t Dh) {
    const int64_t rows = KV_TILE_FLOATS / Dh;
    return rows < 1 ? 1 : rows;
}

/* attend_head over a float16 or Q8_0 cache. With AVX-512 the products read the stored
 * rows and convert them in registers (kv.c); otherwise the keys (then the values) of
 * [lo, hi] are converted a tile at a time into `tile` (kv_tile_rows(Dh) rows, L1) and
 * scored (weighted) from there. row_bytes: one cache row. */
static void attend_head_narrow(const float *q, const uint8_t *keys, const uint8_t *values,
                               int type, int64_t row_bytes, int64_t lo, int64_t hi,
                               int64_t Dh, float scale, float softcap, float sink,
                               float *scores, float *qs, float *tile, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        qs[d] = q[d] * scale;
    const int64_t n = hi - lo + 1, rows = kv_tile_rows(Dh);
#ifdef HAVE_AVX512_ATTENTION
    const int wide = use_avx512_attention(Dh);
#else
    const int wide = 0;
#endif
#ifdef HAVE_AVX512_ATTENTION
    if (wide)
        kv_scores_avx512(type, qs, keys + lo * row_bytes, n, Dh, scores);
    else
#endif
        for (int64_t t0 = 0; t0 < n; t0 += rows) {
            const int64_t m = n - t0 < rows ? n - t0 : rows;
            kv_rows_f32(type, keys + (lo + t0) * row_bytes, m, Dh, tile);
            scores_of(qs, tile, m, Dh, scores + t0);
        }
    const float mx = capped_max(scores, n, softcap, sink);
#ifdef HAVE_AVX512_ATTENTION
    const float sum = wide ? exp_and_sum_avx512(scores, n, mx) : exp_and_sum(scores, n, mx);
#else
    const float sum = exp_and_sum(scores, n, mx);
#endif
    const float inv = 1.0f / with_sink_sum(sum, sink, mx);
#ifdef HAVE_AVX512_ATTENTION
    if (wide) {
        kv_weighted_avx512(type, scores, values + lo * row_bytes, n, Dh, inv, out);
        return;
    }
#endif
    for (int64_t d = 0; d < Dh; d++)
        out[d] = 0.f;
    for (int64_t t0 = 0; t0 < n; t0 += rows) {
        const int64_t m = n - t0 < rows ? n - t0 : rows;
        kv_rows_f32(type, values + (lo + t0) * row_bytes, m, Dh, tile);
        weighted_more(scores + t0, tile, m, Dh, inv, out);
    }
}

typedef struct {
    const float *q;
    const uint8_t *kcache, *vcache;
    int64_t n_slots, head_stride, layer_base, H, Hkv, Dh, window, row_bytes;
    const int64_t *slots, *positions;
    const float *sinks; /* (H,) or NULL */
    float scale, softcap;
    float *out;
    int type;
} attn_job;

static void attn_one(void *ctx, int64_t j) {
    const attn_job *a = ctx;
    const int64_t b = j / a->H, h = j % a->H, p = a->positions[b];
    const int64_t lo = a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
    const int64_t base =
        a->layer_base + (a->slots[b] * a->Hkv + h / (a->H / a->Hkv)) * a->head_stride;
    const int narrow = a->type != KV_F32;
    float stack[4096];
    const int64_t need =
        (p - lo + 1) + a->Dh + (narrow ? kv_tile_rows(a->Dh) * a->Dh : 0);
    float *scratch = need <= 4096 ? stack : malloc((size_t)need * sizeof(float));
    if (scratch == NULL)
        return; /* out of memory: leaves this head's output as it was */
    const float *q = a->q + (b * a->H + h) * a->Dh;
    float *out = a->out + (b * a->H + h) * a->Dh;
    const uint8_t *keys = a->kcache + base * a->row_bytes;
    const uint8_t *values = a->vcache + base * a->row_bytes;
    if (narrow)
        attend_head_narrow(q, keys, values, a->type, a->row_bytes, lo, p, a->Dh, a->scale,
                           a->softcap, sink_of(a->sinks, h), scratch + a->Dh, scratch,
                           scratch + a->Dh + (p - lo + 1), out);
    else
        attend_head(q, (const float *)keys, (const float *)values, lo, p, a->Dh, a->scale,
                    a->softcap, sink_of(a->sinks, h), scratch + a->Dh, scratch, out);
    if (scratch != stack)
        free(scratch);
}

#ifdef HAVE_AVX512_ATTENTION
/* ---- Decode attention by KV head (GQA) ---------------------------------------------------
 *
 * The G = H / Hkv query heads sharing a KV head go through its keys and values together,
 * GROUP_TILE keys at a time, so each cache row comes from memory once instead of once per
 * query head (SmolLM2 at 3,000 cached positions read its float32 cache three times: two
 * thirds of a step). The bits are attend_head's: every score is scores_avx512's for that
 * key alone, every softmax runs over the whole range as there, and every output lane is
 * the same chain of FMAs in key order (the accumulators go to `out` between tiles and
 * back, which rounds nothing). float32 caches with AVX-512 only; the rest take attn_one. */
#define GROUP_TILE 64

static void attn_group(void *ctx, int64_t j) {
    const attn_job *a = ctx;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh;
    const int64_t b = j / a->Hkv, kvh = j % a->Hkv, p = a->positions[b];
    const int64_t lo = a->window > 0 && p + 1 > a->window ? p + 1 - a->window : 0;
    const int64_t n = p - lo + 1, h0 = kvh * G;
    const int64_t base = a->layer_base + (a->slots[b] * a->Hkv + kvh) * a->head_stride;
    const float *keys = (const float *)(a->kcache + base * a->row_bytes) + lo * Dh;
    const float *values = (const float *)(a->vcache + base * a->row_bytes) + lo * Dh;
    float stack[8192];
    const int64_t need = G * (n + Dh + 1);
    float *scratch = need <= 8192 ? stack : malloc((size_t)need * sizeof(float));
    if (scratch == NULL)
        return; /* out of memory: leaves these heads' output as it was */
    float *qs = scratch, *inv = scratch + G * Dh, *scores = inv + G;
    for (int64_t g = 0; g < G; g++)
        for (int64_t d = 0; d < Dh; d++)
            qs[g * Dh + d] = a->q[(b * a->H + h0 + g) * Dh + d] * a->scale;
    for (int64_t t0 = 0; t0 < n; t0 += GROUP_TILE) {
        const int64_t m = n - t0 < GROUP_TILE ? n - t0 : GROUP_TILE;
        for (int64_t g = 0; g < G; g++)
            scores_avx512(qs + g * Dh, keys + t0 * Dh, m, Dh, scores + g * n + t0);
    }
    for (int64_t g = 0; g < G; g++) {
        float *s = scores + g * n;
        const float sink = sink_of(a->sinks, h0 + g);
        const float mx = capped_max(s, n, a->softcap, sink);
        const float sum = exp_and_sum_avx512(s, n, mx);
        inv[g] = 1.0f / with_sink_sum(sum, sink, mx); /* weighted_avx512's inv */
        float *out = a->out + (b * a->H + h0 + g) * Dh;
        for (int64_t d = 0; d < Dh; d++)
            out[d] = 0.f;
    }
    for (int64_t t0 = 0; t0 < n; t0 += GROUP_TILE) {
        const int64_t m = n - t0 < GROUP_TILE ? n - t0 : GROUP_TILE;
        for (int64_t g = 0; g < G; g++)
            weighted_more_avx512(scores + g * n + t0, values + t0 * Dh, m, Dh, inv[g],
                                 a->out + (b * a->H + h0 + g) * Dh);
    }
    if (scratch != stack)
        free(scratch);
}
#endif

void cpu_attention_decode(int nthreads, const float *q, const float *k, const float *v,
                          const kv_cache *kv, int64_t layer, const int64_t *slots,
                          const int64_t *positions, int64_t B, int64_t H, int64_t Hkv,
                          int64_t Dh, float scale, int64_t window, float softcap,
                          const float *sinks, float *out) {
    /* Offsets count rows (positions of one head); row_bytes turns them into bytes. */
    const int64_t head_stride = kv->n_ctx, row_bytes = kv_row_bytes(kv->type, Dh);
    const int64_t layer_base = layer * kv->n_slots * Hkv * head_stride;
    uint8_t *kcache = kv->k, *vcache = kv->v;
    int64_t longest = 1;
    for (int64_t b = 0; b < B; b++) {
        const int64_t p = positions[b];
        if (p + 1 > longest)
            longest = p + 1;
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t at = (layer_base + (slots[b] * Hkv + h) * head_stride + p) * row_bytes;
            kv_store_row(kv->type, k + (b * Hkv + h) * Dh, Dh, kcache + at);
            kv_store_row(kv->type, v + (b * Hkv + h) * Dh, Dh, vcache + at);
        }
    }
    attn_job job = {.q = q, .kcache = kcache, .vcache = vcache, .n_slots = kv->n_slots,
                    .head_stride = head_stride, .layer_base = layer_base, .H = H, .Hkv = Hkv,
                    .Dh = Dh, .window = window, .row_bytes = row_bytes, .slots = slots,
                    .positions = positions, .sinks = sinks, .scale = scale,
                    .softcap = softcap, .out = out, .type = kv->type};
    const int nt = (double)B * (double)H * (double)longest * (double)Dh < 32768.0 ? 1 : nthreads;
#ifdef HAVE_AVX512_ATTENTION
    /* By KV head where that still gives every thread a job (same bits either way). */
    if (kv->type == KV_F32 && H > Hkv && H % Hkv == 0 && use_avx512_attention(Dh) &&
        B * Hkv >= nt) {
        pool_run(nt, B * Hkv, attn_group, &job);
        return;
    }
#endif
    pool_run(nt, B * H, attn_one, &job);
}

/* ---- Prefill attention: one sequence's chunk of T queries, blocked --------------------
 *
 * One pool job per (KV head, block of R query rows): its R x G query vectors ("qvs", G =
 * H / Hkv heads sharing the KV head) read every key and value of the job's range once
 * from memory (L3), then from L1 across all qvs. Pass 1 writes the scores (qv-major rows,
 * absolute key j at column j - kb0, kb0 = the range's first key rounded down to 16),
 * pass 2 turns each row into softmax weights (soft-cap, max, exp_and_sum), pass 3 adds
 * the weighted values into per-qv accumulators, a few qvs at a time in registers.
 * Every score, every row's sum and every qv's weighted sum is computed in the same order
 * whatever the job's shape (key blocks aligned to absolute positions, a partial block
 * zero-padded, each accumulator a chain over keys in order), so the bits depend neither
 * on R nor on the thread count. */

#define PF_KEYS 16 /* keys per pass-1 tile: one horizontal-sum transpose */
#define PF_GROUP 6 /* qvs per pass-3 register tile (x 4 chunks of 16 = 24 zmm) */

typedef struct {
    const float *q;
    const uint8_t *kbase, *vbase; /* this layer and slot's head 0 */
    int64_t T, start, H, Hkv, Dh, R, n_blocks, head_stride, window, row_bytes;
    const float *sinks; /* (H,) or NULL */
    float scale, softcap;
    float *out;
    int wide, failed, type;
} prefill_job;

static inline int64_t pf_lo(int64_t p, int64_t window) {
    return window > 0 && p + 1 > window ? p + 1 - window : 0;
}

#ifdef HAVE_AVX512_ATTENTION
/* acc[k]'s 16 lanes summed, k = 0..15, as one vector; every sum in the same order
 * ((e0 + e2) + (e1 + e3) per 128-bit lane, then (L0 + L1) + (L2 + L3)). */
__attribute__((target("avx512f,fma"), always_inline)) static inline __m512
hsum16(const __m512 *acc) {
    __m512 r[8], s[4];
    for (int k = 0; k < 8; k++)
        r[k] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * k], acc[2 * k + 1]),
                             _mm512_unpackhi_ps(acc[2 * k], acc[2 * k + 1]));
    for (int m = 0; m < 4; m++) {
        const __m512d a = _mm512_castps_pd(r[2 * m]), b = _mm512_castps_pd(r[2 * m + 1]);
        s[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88),
                                    _mm512_shuffle_f32x4(s[0], s[1], 0xDD));
    const __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x88),
                                    _mm512_shuffle_f32x4(s[2], s[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88),
                         _mm512_shuffle_f32x4(u0, u1, 0xDD));
}

/* scores[0..15] = qs . keys[k] for 16 consecutive keys (rows of Dh). */
__attribute__((target("avx512f,fma"))) static void pf_scores16(const float *qs,
                                                              const float *keys, int64_t Dh,
                                                              float *scores) {
    __m512 acc[PF_KEYS];
    __m512 qc = _mm512_loadu_ps(qs);
    for (int k = 0; k < PF_KEYS; k++)
        acc[k] = _mm512_mul_ps(qc, _mm512_loadu_ps(keys + k * Dh));
    for (int64_t c = 16; c < Dh; c += 16) {
        qc = _mm512_loadu_ps(qs + c);
        for (int k = 0; k < PF_KEYS; k++)
            acc[k] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(keys + k * Dh + c), acc[k]);
    }
    _mm512_storeu_ps(scores, hsum16(acc));
}

/* acc[i] (NC chunks of 16 at column c0 of each qv's Dh-row) += w[i][j] * values[j] for keys
 * j in [j0, j1); masked: only the qvs whose range [lo[i], hi[i]] holds j. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void
pf_pv_tile(float *const *w, const int64_t *lo, const int64_t *hi, const float *values,
           int64_t vj0, int64_t Dh, int64_t c0, int64_t j0, int64_t j1, int64_t fast0,
           int64_t fast1, float *acc, const int NC) {
    __m512 a[PF_GROUP][4];
    for (int i = 0; i < PF_GROUP; i++)
        for (int c = 0; c < NC; c++)
            a[i][c] = _mm512_loadu_ps(acc + i * Dh + c0 + 16 * c);
    for (int64_t j = j0; j < j1; j++) {
        const float *vr = values + (j - vj0) * Dh + c0;
        __m512 v[4];
        for (int c = 0; c < NC; c++)
            v[c] = _mm512_loadu_ps(vr + 16 * c);
        if (j >= fast0 && j < fast1) {
            for (int i = 0; i < PF_GROUP; i++) {
                const __m512 p = _mm512_set1_ps(w[i][j]);
                for (int c = 0; c < NC; c++)
                    a[i][c] = _mm512_fmadd_ps(p, v[c], a[i][c]);
            }
        } else {
            for (int i = 0; i < PF_GROUP; i++) {
                const __mmask16 m = j >= lo[i] && j <= hi[i] ? 0xFFFF : 0;
                const __m512 p = _mm512_set1_ps(w[i][j]);
                for (int c = 0; c < NC; c++)
                    a[i][c] = _mm512_mask3_fmadd_ps(p, v[c], a[i][c], m);
            }
        }
    }
    for (int i = 0; i < PF_GROUP; i++)
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(acc + i * Dh + c0 + 16 * c, a[i][c]);
}

__attribute__((target("avx512f,fma"))) static void
pf_pv_avx512(float *const *w, const int64_t *lo, const int64_t *hi, const float *values,
             int64_t vj0, int64_t Dh, int64_t j0, int64_t j1, int64_t fast0, int64_t fast1,
             float *acc) {
    for (int64_t c0 = 0; c0 < Dh; c0 += 64) {
        switch ((Dh - c0) >= 64 ? 4 : (int)((Dh - c0) / 16)) {
        case 4:
            pf_pv_tile(w, lo, hi, values, vj0, Dh, c0, j0, j1, fast0, fast1, acc, 4);
            break;
        case 3:
            pf_pv_tile(w, lo, hi, values, vj0, Dh, c0, j0, j1, fast0, fast1, acc, 3);
            break;
        case 2:
            pf_pv_tile(w, lo, hi, values, vj0, Dh, c0, j0, j1, fast0, fast1, acc, 2);
            break;
        default:
            pf_pv_tile(w, lo, hi, values, vj0, Dh, c0, j0, j1, fast0, fast1, acc, 1);
        }
    }
}
#endif

/* Portable pass 1: every (qv, key) score of the job, key-major (a key row read once);
 * keys[0] is key key0. */
ISA_CLONES static void pf_scores_plain(const float *qs, const float *keys, int64_t key0,
                                       int64_t nq, const int64_t *lo, const int64_t *hi,
                                       int64_t klo, int64_t khi, int64_t Dh, float *scores,
                                       int64_t stride, int64_t kb0) {
    for (int64_t j = klo; j <= khi; j++) {
        const float *kr = keys + (j - key0) * Dh;
        for (int64_t i = 0; i < nq; i++) {
            if (j < lo[i] || j > hi[i])
                continue;
            const float *qr = qs + i * Dh;
            float acc[LANES] = {0};
            int64_t d = 0;
            for (; d + LANES <= Dh; d += LANES)
                for (int l = 0; l < LANES; l++)
                    acc[l] += qr[d + l] * kr[d + l];
            for (int w = LANES / 2; w > 0; w /= 2)
                for (int l = 0; l < w; l++)
                    acc[l] += acc[l + w];
            float s = acc[0];
            for (; d < Dh; d++)
                s += qr[d] * kr[d];
            scores[i * stride + (j - kb0)] = s;
        }
    }
}

/* Portable pass 3: acc[i] += w[i][j] * values[j], key-major (a value row read once);
 * values[0] is key key0. */
ISA_CLONES static void pf_pv_plain(float *const *w, const int64_t *lo, const int64_t *hi,
                                   int64_t nq, const float *values, int64_t key0, int64_t klo,
                                   int64_t khi, int64_t Dh, float *acc) {
    for (int64_t j = klo; j <= khi; j++) {
        const float *vr = values + (j - key0) * Dh;
        for (int64_t i = 0; i < nq; i++) {
            if (j < lo[i] || j > hi[i])
                continue;
            const float p = w[i][j];
            float *ar = acc + i * Dh;
            for (int64_t d = 0; d < Dh; d++)
                ar[d] += p * vr[d];
        }
    }
}

static void prefill_one(void *ctx, int64_t jx) {
    prefill_job *a = ctx;
    /* Biggest jobs (the last rows: the most keys) first, so the pool ends evenly. */
    const int64_t g = jx % a->Hkv, blk = a->n_blocks - 1 - jx / a->Hkv;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh;
    const int64_t t0 = blk * a->R, t1 = t0 + a->R < a->T ? t0 + a->R : a->T;
    const int64_t nq = (t1 - t0) * G, nq_pad = (nq + PF_GROUP - 1) / PF_GROUP * PF_GROUP;
    const int64_t klo = pf_lo(a->start + t0, a->window), khi = a->start + t1 - 1;
    const int64_t kb0 = klo & ~(int64_t)(PF_KEYS - 1);
    const int64_t stride = (khi - kb0 + PF_KEYS) & ~(int64_t)(PF_KEYS - 1);
    /* A narrow cache (float16, Q8_0) is read a tile at a time into float32: 16 keys into
     * `pad` (pass 1), a block of kblock values into `vtile` (pass 3). */
    const int narrow = a->type != KV_F32;
    const uint8_t *krows = a->kbase + g * a->head_stride * a->row_bytes;
    const uint8_t *vrows = a->vbase + g * a->head_stride * a->row_bytes;
    const float *keys = (const float *)krows, *values = (const float *)vrows;
    const int64_t kblock = Dh <= 64 ? 64 : 4096 / Dh > 16 ? 4096 / Dh : 16;

    const size_t n_floats = (size_t)(nq_pad * Dh * 2 + nq_pad * stride + PF_KEYS * Dh +
                                     (narrow ? kblock * Dh : 0));
    char *mem = malloc(n_floats * sizeof(float) + (size_t)nq_pad * (2 * sizeof(int64_t) +
                                                                    sizeof(float *) +
                                                                    sizeof(float)));
    if (mem == NULL) {
        __atomic_store_n(&a->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *qs = (float *)mem, *acc = qs + nq_pad * Dh, *scores = acc + nq_pad * Dh;
    float *pad = scores + nq_pad * stride, *vtile = pad + PF_KEYS * Dh;
    int64_t *lo = (int64_t *)(vtile + (narrow ? kblock * Dh : 0)), *hi = lo + nq_pad;
    float **w = (float **)(hi + nq_pad);
    float *inv = (float *)(w + nq_pad);

    /* qv i = (row t0 + i / G, head g * G + i % G); w[i][j]: its weight of key j. The
     * padding qvs see no key (their accumulators, never read, may take the last row's
     * weights where a tile runs unmasked). */
    for (int64_t i = 0; i < nq_pad; i++) {
        w[i] = scores + (i < nq ? i : nq - 1) * stride - kb0;
        if (i >= nq) {
            lo[i] = 1;
            hi[i] = 0;
            continue;
        }
        const int64_t t = t0 + i / G, h = g * G + i % G, p = a->start + t;
        lo[i] = pf_lo(p, a->window);
        hi[i] = p;
        const float *qr = a->q + (t * a->H + h) * Dh;
        for (int64_t d = 0; d < Dh; d++)
            qs[i * Dh + d] = qr[d] * a->scale;
    }
    memset(acc, 0, (size_t)(nq_pad * Dh) * sizeof(float));

    /* Pass 1: scores. */
#ifdef HAVE_AVX512_ATTENTION
    if (a->wide) {
        for (int64_t kb = kb0; kb <= khi; kb += PF_KEYS) {
            const float *tile = keys + kb * Dh;
            if (narrow) {
                const int64_t m = khi - kb + 1 < PF_KEYS ? khi - kb + 1 : PF_KEYS;
                kv_rows_f32(a->type, krows + kb * a->row_bytes, m, Dh, pad);
                memset(pad + m * Dh, 0, (size_t)((PF_KEYS - m) * Dh) * sizeof(float));
                tile = pad;
            } else if (kb + PF_KEYS - 1 > khi) { /* the last, partial tile: zero-padded copy */
                memset(pad, 0, (size_t)(PF_KEYS * Dh) * sizeof(float));
                memcpy(pad, tile, (size_t)((khi - kb + 1) * Dh) * sizeof(float));
                tile = pad;
            }
            for (int64_t i = 0; i < nq; i++)
                if (kb + PF_KEYS > lo[i] && kb <= hi[i])
                    pf_scores16(qs + i * Dh, tile, Dh, w[i] + kb);
        }
    } else
#endif
    if (narrow) { /* 16 keys at a time converted into `pad` */
        for (int64_t j0 = klo; j0 <= khi; j0 += PF_KEYS) {
            const int64_t j1 = j0 + PF_KEYS - 1 < khi ? j0 + PF_KEYS - 1 : khi;
            kv_rows_f32(a->type, krows + j0 * a->row_bytes, j1 - j0 + 1, Dh, pad);
            pf_scores_plain(qs, pad, j0, nq, lo, hi, j0, j1, Dh, scores, stride, kb0);
        }
    } else {
        pf_scores_plain(qs, keys, 0, nq, lo, hi, klo, khi, Dh, scores, stride, kb0);
    }

    /* Pass 2: each row's softmax weights (unnormalised; 1 / sum kept for the end). */
    for (int64_t i = 0; i < nq; i++) {
        float *s = w[i] + lo[i];
        const int64_t n = hi[i] - lo[i] + 1;
        const float sink = sink_of(a->sinks, g * G + i % G);
        if (a->softcap > 0.f)
            for (int64_t t = 0; t < n; t++)
                s[t] = a->softcap * tanhf(s[t] / a->softcap);
#ifdef HAVE_AVX512_ATTENTION
        if (a->wide) {
            const float mx = with_sink_max(max_avx512(s, n), sink);
            inv[i] = 1.0f / with_sink_sum(exp_and_sum_avx512(s, n, mx), sink, mx);
            continue;
        }
#endif
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; t++)
            if (s[t] > mx)
                mx = s[t];
        mx = with_sink_max(mx, sink);
        inv[i] = 1.0f / with_sink_sum(exp_and_sum(s, n, mx), sink, mx);
    }

    /* Pass 3: weighted values. */
#ifdef HAVE_AVX512_ATTENTION
    if (a->wide) {
        for (int64_t jb = klo; jb <= khi; jb += kblock) {
            const int64_t je = jb + kblock <= khi + 1 ? jb + kblock : khi + 1;
            const float *vals = values;
            int64_t vj0 = 0;
            if (narrow) {
                kv_rows_f32(a->type, vrows + jb * a->row_bytes, je - jb, Dh, vtile);
                vals = vtile;
                vj0 = jb;
            }
            for (int64_t i0 = 0; i0 < nq; i0 += PF_GROUP) {
                int64_t fast0 = jb, fast1 = je, any0 = je, any1 = jb;
                for (int64_t i = i0; i < i0 + PF_GROUP && i < nq; i++) {
                    fast0 = lo[i] > fast0 ? lo[i] : fast0;
                    fast1 = hi[i] + 1 < fast1 ? hi[i] + 1 : fast1;
                    any0 = lo[i] < any0 ? lo[i] : any0;
                    any1 = hi[i] + 1 > any1 ? hi[i] + 1 : any1;
                }
                any0 = any0 > jb ? any0 : jb;
                any1 = any1 < je ? any1 : je;
                if (any0 >= any1)
                    continue; /* no qv of the group sees this block */
                pf_pv_avx512(w + i0, lo + i0, hi + i0, vals, vj0, Dh, any0, any1, fast0, fast1,
                             acc + i0 * Dh);
            }
        }
    } else
#endif
    if (narrow) { /* a block of values at a time converted into `vtile` */
        for (int64_t jb = klo; jb <= khi; jb += kblock) {
            const int64_t je = jb + kblock - 1 < khi ? jb + kblock - 1 : khi;
            kv_rows_f32(a->type, vrows + jb * a->row_bytes, je - jb + 1, Dh, vtile);
            pf_pv_plain(w, lo, hi, nq, vtile, jb, jb, je, Dh, acc);
        }
    } else {
        pf_pv_plain(w, lo, hi, nq, values, 0, klo, khi, Dh, acc);
    }

    for (int64_t i = 0; i < nq; i++) {
        const int64_t t = t0 + i / G, h = g * G + i % G;
        float *o = a->out + (t * a->H + h) * Dh;
        for (int64_t d = 0; d < Dh; d++)
            o[d] = acc[i * Dh + d] * inv[i];
    }
    free(mem);
}

int cpu_attention_prefill(int nthreads, const float *q, const float *k, const float *v,
                          const kv_cache *kv, int64_t layer, int64_t slot, int64_t start,
                          int64_t T, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                          int64_t window, float softcap, const float *sinks, float *out) {
    if (T <= 0)
        return 0;
    /* Offsets count rows (positions of one head); row_bytes turns them into bytes. */
    const int64_t head_stride = kv->n_ctx, row_bytes = kv_row_bytes(kv->type, Dh);
    const int64_t base = (layer * kv->n_slots + slot) * Hkv * head_stride;
    uint8_t *kcache = kv->k, *vcache = kv->v;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t at = (base + h * head_stride + start + t) * row_bytes;
            kv_store_row(kv->type, k + (t * Hkv + h) * Dh, Dh, kcache + at);
            kv_store_row(kv->type, v + (t * Hkv + h) * Dh, Dh, vcache + at);
        }
    if (H <= 0 || Dh <= 0)
        return 0; /* nothing to attend */
    const int64_t G = H / Hkv;
    int64_t R = 48 / G;
    R = R < 1 ? 1 : R > 16 ? 16 : R;
    R = R < T ? R : T;
    /* Enough jobs for every thread (a smaller block re-reads the keys more often). */
    while (R > 4 && Hkv * ((T + R - 1) / R) < 2 * (int64_t)nthreads)
        R = (R + 1) / 2;
    const int64_t n_blocks = (T + R - 1) / R;
#ifdef HAVE_AVX512_ATTENTION
    const int wide = use_avx512_attention(Dh);
#else
    const int wide = 0;
#endif
    prefill_job job = {.q = q, .kbase = kcache + base * row_bytes,
                       .vbase = vcache + base * row_bytes, .row_bytes = row_bytes,
                       .type = kv->type, .T = T,
                       .start = start, .H = H, .Hkv = Hkv, .Dh = Dh, .R = R,
                       .n_blocks = n_blocks, .head_stride = head_stride, .window = window,
                       .sinks = sinks, .scale = scale, .softcap = softcap, .out = out,
                       .wide = wide,
                       .failed = 0};
    const int nt =
        (double)T * (double)H * (double)(start + T) * (double)Dh < 32768.0 ? 1 : nthreads;
    pool_run(nt, Hkv * n_blocks, prefill_one, &job);
    return job.failed ? -1 : 0;
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
