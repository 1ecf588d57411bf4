/* Prefill attention: one sequence's chunk of queries over its cached history and itself
 * (see ops.h), with decode attention's bits for every query. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "pool.h"
#include "vec_math.h"

#ifdef HAVE_AVX512_ATTENTION
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
#endif

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
    const int wide = avx512_rows(Dh);
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
