/* Decode attention: each row's query heads over its slot's cached keys and values (see
 * ops.h). A query head's softmax runs over its whole range; every output lane adds its
 * terms in key order, so the bits depend on nothing but the row's own inputs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "pool.h"
#include "vec_math.h"

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

#ifdef HAVE_AVX512_ATTENTION
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
#endif

/* One query head over positions [lo, hi] of its KV head: keys/values (n_ctx, Dh). */
static void attend_head(const float *q, const float *keys, const float *values, int64_t lo,
                        int64_t hi, int64_t Dh, float scale, float softcap, float sink,
                        float *scores, float *qs, float *out) {
    for (int64_t d = 0; d < Dh; d++)
        qs[d] = q[d] * scale;
    const int64_t n = hi - lo + 1;
    const int wide = avx512_rows(Dh);
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
    const int wide = avx512_rows(Dh);
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
