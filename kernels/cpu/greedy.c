/* See greedy.h. Greedy decoding needs each row's argmax, not its logits, and the output
 * product (49,152 x 576 for SmolLM2) is a fifth of a B = 8 step's float32 multiply-adds.
 *
 * The screen: x quantised to int8 per 32 values (scale d = max|x| / 127), each row's
 * value a_r from int8 dot products (AVX-512 VNNI: 32 multiply-adds an instruction against
 * a float32 FMA's 8), and a rigorous bound on how far a_r can lie from the float32 value
 * e_r the full product computes:
 *
 *     |e_r - a_r| <= ||W_r|| (||x - x_q|| + eps (||x|| + ||x - x_q||)),  eps = (K + 32) 2^-23
 *
 * Cauchy-Schwarz bounds the quantisation of x; eps covers float32 rounding in both
 * products (each within K u sum|w x|, u = 2^-24, twice over; Q8_0 weights dequantise
 * exactly). The argmax is among the rows whose upper bound reaches the largest lower
 * bound; only those are computed in float32, by cpu_linear's own row kernel, which gives
 * a row the same bits whatever tile, call or thread it is in. On 171 states of SmolLM2's
 * own story the candidates are 3 rows in the median, 86 at most (bench/RESULTS.md). */
#include "greedy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quants.h"

#define MAX_CANDIDATES 4096 /* past this a row is computed whole (a bound this loose is rare) */
#define XB 8                /* x rows screened per pass over w (the VNNI screen's lanes) */
#define RT 8                /* weight rows per VNNI tile: 8 vpdpbusd chains in flight */
#define Q8_BYTES 34

typedef struct {
    const uint8_t *w;
    size_t rb;
    int64_t N, K, B, chunk;
    const int8_t *xq;     /* B x K */
    const float *xd;      /* B x K / 32 */
    const uint8_t *xt;    /* the VNNI screen's x: K / 32 blocks of 8 groups of 8 lanes */
    const float *xd8;     /* K / 32 blocks of 8 lanes */
    const int16_t *sums;  /* N x K / 32: each block's sum of q */
    float *out;       /* B x N: the screened values, then the result */
    /* selection */
    int isa;
    const float *x, *norms;
    const double *xn, *dn; /* ||x_b||, ||x_b - x_q b|| */
    const int64_t *ban_off, *ban_ids;
    int64_t *candidates; /* per x row: how many were computed in float32 (or NULL) */
} greedy_job;

/* ------------------------------------------------------------------ the screen */

/* The portable screen (the driver hands it at most XB x rows): the same sums as the
 * VNNI one, a row at a time. */
static void screen_generic(const greedy_job *j, int64_t r0, int64_t r1) {
    const int64_t K = j->K, nb = K / 32, N = j->N;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = j->w + r * j->rb;
        float acc[XB] = {0};
        for (int64_t c = 0; c < nb; c++) {
            const uint8_t *bp = row + c * Q8_BYTES;
            const int8_t *q = (const int8_t *)(bp + 2);
            const float dw = f16_table[rd16(bp)];
            for (int64_t b = 0; b < j->B; b++) {
                const int8_t *xq = j->xq + b * K + c * 32;
                int32_t s = 0;
                for (int i = 0; i < 32; i++)
                    s += (int32_t)q[i] * (int32_t)xq[i];
                acc[b] += (float)s * (dw * j->xd[b * nb + c]);
            }
        }
        for (int64_t b = 0; b < j->B; b++)
            j->out[b * N + r] = acc[b];
    }
}

/* The selection's two scans from row r on, one row at a time (the portable path, and the
 * vector scans' tails): max_r (o[r] - norms[r] c) and max_r norms[r] into *lo, *top... */
static void lower_max_from(const float *o, const float *norms, float c, int64_t r, int64_t N,
                           float *lo, float *top) {
    for (; r < N; r++) {
        const float v = o[r] - norms[r] * c;
        *lo = v > *lo ? v : *lo;
        *top = norms[r] > *top ? norms[r] : *top;
    }
}

/* ...and the rows whose upper bound reaches `bar` appended to list (up to cap; returns how
 * many there are in all), every value of o set to -inf. */
static int64_t candidates_from(float *o, const float *norms, float c, float bar, int64_t r,
                               int64_t N, int64_t *list, int64_t n, int64_t cap) {
    for (; r < N; r++) {
        if (o[r] + norms[r] * c >= bar) {
            if (n < cap)
                list[n] = r;
            n++;
        }
        o[r] = -INFINITY;
    }
    return n;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GREEDY_VNNI 1
#include <immintrin.h>
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* x rows in lanes: xt holds, per block and per 4-byte group g, lane b's bytes x_u[b] of
 * that group (x_u = x_q + 128, unsigned as VNNI's first operand must be), so one vpdpbusd
 * with the weight row's 4 bytes broadcast adds a group's 4 products for all 8 x rows;
 * 128 sum(w) per block (sums) takes the offset back out. RT weight rows a tile, their
 * chains interleaved (a vpdpbusd waits ~4 cycles on its row's previous one; two issue a
 * cycle). */
VNNI_TARGET static inline __attribute__((always_inline)) void
screen_tile_vnni(const greedy_job *j, int64_t r, const int R) {
    const int64_t nb = j->K / 32;
    __m256 acc[RT];
    for (int t = 0; t < R; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nb; c++) {
        const __m256i *xt = (const __m256i *)(j->xt + c * 256);
        const __m256 dh = _mm256_load_ps(j->xd8 + c * 8);
        { /* The tile 4 ahead into L2, a share each block: with the hardware prefetcher
             * alone the screen read w at ~6 GB/s (8 rows 612 bytes apart at once); with
             * this, 1.5 ms for SmolLM2's 30 MB at B = 8 in a decode step, 3.0 for linear. */
            const uint8_t *next = j->w + (r + 4 * RT) * j->rb + c * (RT * j->rb / nb);
            for (int k = 0; k < (int)(RT * j->rb / nb); k += 64)
                _mm_prefetch((const char *)next + k, _MM_HINT_T1);
        }
        const uint8_t *q[RT];
        __m256i d[RT];
        for (int t = 0; t < R; t++) {
            q[t] = j->w + (r + t) * j->rb + c * Q8_BYTES + 2;
            d[t] = _mm256_set1_epi32(-128 * (int32_t)j->sums[(r + t) * nb + c]);
        }
        for (int g = 0; g < 8; g++) {
            const __m256i xg = _mm256_load_si256(xt + g);
            for (int t = 0; t < R; t++)
                d[t] = _mm256_dpbusd_epi32(d[t], xg, _mm256_set1_epi32((int32_t)rd32(q[t] + 4 * g)));
        }
        for (int t = 0; t < R; t++) {
            const __m256 s = _mm256_mul_ps(_mm256_set1_ps(f16_table[rd16(q[t] - 2)]), dh);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d[t]), s, acc[t]);
        }
    }
    for (int t = 0; t < R; t++) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[t]);
        for (int64_t b = 0; b < j->B; b++)
            j->out[b * j->N + r + t] = lanes[b];
    }
}

VNNI_TARGET static void screen_vnni(const greedy_job *j, int64_t r0, int64_t r1) {
    int64_t r = r0;
    for (; r + RT <= r1; r += RT)
        screen_tile_vnni(j, r, RT);
    for (; r < r1; r++)
        screen_tile_vnni(j, r, 1);
}

/* lower_max_from over all rows, 16 at a time. */
VNNI_TARGET static void lower_max_vnni(const float *o, const float *norms, float c, int64_t N,
                                       float *lo, float *top) {
    __m512 l = _mm512_set1_ps(-INFINITY), t = _mm512_setzero_ps();
    const __m512 cv = _mm512_set1_ps(c);
    int64_t r = 0;
    for (; r + 16 <= N; r += 16) {
        const __m512 nv = _mm512_loadu_ps(norms + r);
        l = _mm512_max_ps(l, _mm512_fnmadd_ps(nv, cv, _mm512_loadu_ps(o + r)));
        t = _mm512_max_ps(t, nv);
    }
    *lo = _mm512_reduce_max_ps(l), *top = _mm512_reduce_max_ps(t);
    lower_max_from(o, norms, c, r, N, lo, top);
}

/* candidates_from over all rows, 16 at a time. */
VNNI_TARGET static int64_t candidates_vnni(float *o, const float *norms, float c, float bar,
                                           int64_t N, int64_t *list, int64_t cap) {
    const __m512 cv = _mm512_set1_ps(c), bv = _mm512_set1_ps(bar), ninf = _mm512_set1_ps(-INFINITY);
    int64_t n = 0, r = 0;
    for (; r + 16 <= N; r += 16) {
        const __m512 up = _mm512_fmadd_ps(_mm512_loadu_ps(norms + r), cv, _mm512_loadu_ps(o + r));
        __mmask16 m = _mm512_cmp_ps_mask(up, bv, _CMP_GE_OQ);
        _mm512_storeu_ps(o + r, ninf);
        while (m) {
            if (n < cap)
                list[n] = r + __builtin_ctz(m);
            n++;
            m &= (__mmask16)(m - 1);
        }
    }
    return candidates_from(o, norms, c, bar, r, N, list, n, cap);
}
#endif

int cpu_greedy_fast(int isa) {
#ifdef GREEDY_VNNI
    __builtin_cpu_init();
    return isa == ISA_AVX512 && __builtin_cpu_supports("avx512vnni");
#else
    (void)isa;
    return 0;
#endif
}

static void screen_chunk(void *ctx, int64_t i) {
    const greedy_job *j = ctx;
    const int64_t r0 = i * j->chunk, r1 = r0 + j->chunk < j->N ? r0 + j->chunk : j->N;
#ifdef GREEDY_VNNI
    if (cpu_greedy_fast(j->isa)) {
        screen_vnni(j, r0, r1);
        return;
    }
#endif
    screen_generic(j, r0, r1);
}

/* ------------------------------------------------------------------ the selection */

static float round_up(double v) {
    float f = (float)v;
    return (double)f < v ? nextafterf(f, INFINITY) : f;
}

static void lower_max(const greedy_job *j, const float *o, float c, float *lo, float *top) {
#ifdef GREEDY_VNNI
    if (cpu_greedy_fast(j->isa)) {
        lower_max_vnni(o, j->norms, c, j->N, lo, top);
        return;
    }
#endif
    *lo = -INFINITY, *top = 0.f;
    lower_max_from(o, j->norms, c, 0, j->N, lo, top);
}

static int64_t candidates(const greedy_job *j, float *o, float c, float bar, int64_t *list) {
#ifdef GREEDY_VNNI
    if (cpu_greedy_fast(j->isa))
        return candidates_vnni(o, j->norms, c, bar, j->N, list, MAX_CANDIDATES);
#endif
    return candidates_from(o, j->norms, c, bar, 0, j->N, list, 0, MAX_CANDIDATES);
}

static void select_row(void *ctx, int64_t b) {
    const greedy_job *j = ctx;
    const int64_t N = j->N, K = j->K;
    float *o = j->out + b * N;
    const float *x = j->x + b * K;
    const linear_rows_fn exact = linear_kernel(j->isa, QT_Q8_0);
    int64_t n = 0;
    if (!isfinite(j->xn[b]) || !isfinite(j->dn[b]))
        goto whole;
    for (int64_t i = j->ban_off[b]; i < j->ban_off[b + 1]; i++)
        if (j->ban_ids[i] >= 0 && j->ban_ids[i] < N)
            o[j->ban_ids[i]] = -INFINITY;
    {
        const double eps = (double)(K + 32) * 0x1p-23;
        /* c rounded up twice over: the float products norms[r] * c round too */
        const float c = round_up((j->dn[b] + eps * (j->xn[b] + j->dn[b])) * (1.0 + 0x1p-20));
        float lo, top;
        lower_max(j, o, c, &lo, &top);
        top *= c;
        if (!(lo > -INFINITY) || !isfinite(lo))
            goto whole; /* every token banned */
        /* slack for the float rounding of a - beta and a + beta (~2^-24 relative) */
        const float bar = lo - ldexpf(fabsf(lo) + 2.f * top, -18);
        int64_t *list = malloc(MAX_CANDIDATES * sizeof(int64_t));
        if (list == NULL)
            goto whole;
        n = candidates(j, o, c, bar, list);
        if (n > MAX_CANDIDATES) {
            free(list);
            goto whole;
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = list[i];
            exact(j->w, j->rb, r, r + 1, K, x, 1, o, N); /* row r of o */
            if (!isfinite(o[r])) {
                free(list);
                goto whole;
            }
        }
        free(list);
        if (j->candidates != NULL)
            j->candidates[b] = n;
        return;
    }
whole:
    exact(j->w, j->rb, 0, N, K, x, 1, o, N);
    if (j->candidates != NULL)
        j->candidates[b] = N;
}

/* ------------------------------------------------------------------ the driver */

void cpu_greedy_prep_q8_0(const uint8_t *w, size_t row_bytes, int64_t N, int64_t K, float *norms,
                          int16_t *sums) {
    const int64_t nb = K / 32;
    for (int64_t r = 0; r < N; r++) {
        double s = 0.0;
        for (int64_t c = 0; c < nb; c++) {
            const uint8_t *bp = w + r * row_bytes + c * Q8_BYTES;
            const double d = (double)f16_table[rd16(bp)];
            int64_t q2 = 0;
            int32_t q1 = 0;
            for (int i = 0; i < 32; i++) {
                const int32_t q = (int8_t)bp[2 + i];
                q2 += (int64_t)(q * q);
                q1 += q;
            }
            s += d * d * (double)q2;
            sums[r * nb + c] = (int16_t)q1;
        }
        norms[r] = round_up(sqrt(s) * (1.0 + 0x1p-40));
    }
}

/* x_q: per 32 values, d = max|x| / 127 and q = round(x / d); ||x|| and ||x - q d|| in
 * double (q d is exact in double). */
static void quantise_x(const float *x, int64_t B, int64_t K, int8_t *xq, float *xd, double *xn,
                       double *dn) {
    const int64_t nb = K / 32;
    for (int64_t b = 0; b < B; b++) {
        double n2 = 0.0, e2 = 0.0;
        for (int64_t c = 0; c < nb; c++) {
            const float *v = x + b * K + c * 32;
            float m = 0.f;
            for (int i = 0; i < 32; i++)
                m = fabsf(v[i]) > m ? fabsf(v[i]) : m;
            const float d = m / 127.f, id = m > 0.f ? 127.f / m : 0.f;
            int8_t *q = xq + b * K + c * 32;
            for (int i = 0; i < 32; i++) {
                float t = nearbyintf(v[i] * id);
                t = t > 127.f ? 127.f : t < -127.f ? -127.f : t;
                q[i] = (int8_t)(isfinite(t) ? t : 0.f);
                const double e = (double)v[i] - (double)q[i] * (double)d;
                n2 += (double)v[i] * (double)v[i];
                e2 += e * e;
            }
            xd[b * nb + c] = d;
        }
        xn[b] = sqrt(n2);
        dn[b] = sqrt(e2);
    }
}

/* The VNNI screen's x: lane b of group g of block c holds x_q[b]'s 4 values of that
 * group, offset by 128; lanes past B hold zeros, with a zero scale. */
static void transpose_x(const int8_t *xq, const float *xd, int64_t B, int64_t K, uint8_t *xt,
                        float *xd8) {
    const int64_t nb = K / 32;
    memset(xt, 0, (size_t)(nb * 256));
    memset(xd8, 0, (size_t)(nb * 8) * sizeof(float));
    for (int64_t c = 0; c < nb; c++)
        for (int64_t b = 0; b < B; b++) {
            for (int g = 0; g < 8; g++)
                for (int i = 0; i < 4; i++)
                    xt[c * 256 + g * 32 + b * 4 + i] = (uint8_t)(xq[b * K + c * 32 + g * 4 + i] + 128);
            xd8[c * 8 + b] = xd[b * nb + c];
        }
}

int cpu_greedy_logits(int isa, int nthreads, const uint8_t *w, size_t row_bytes, int64_t N,
                      int64_t K, const float *norms, const int16_t *sums, const float *x,
                      int64_t B, const int64_t *ban_off, const int64_t *ban_ids, float *out,
                      int64_t *candidates) {
    if (B <= 0 || N <= 0)
        return 0;
    if (cpu_activations(isa) != ACT_FLOAT32) { /* the screen's bound is for float32 products */
        cpu_linear(isa, nthreads, QT_Q8_0, w, row_bytes, N, K, x, B, out, N);
        return 0;
    }
    const int64_t nb = K / 32, G = B < XB ? B : XB;
    int8_t *xq = malloc((size_t)(G * K) + 1);
    float *xd = malloc((size_t)(G * nb + 1) * sizeof(float));
    double *xn = malloc((size_t)G * 2 * sizeof(double));
    uint8_t *xt = aligned_alloc(32, (size_t)(nb * 256) + 32);
    float *xd8 = aligned_alloc(32, (size_t)(nb * 8) * sizeof(float) + 32);
    if (xq == NULL || xd == NULL || xn == NULL || xt == NULL || xd8 == NULL) {
        free(xq), free(xd), free(xn), free(xt), free(xd8);
        return -1;
    }
    const int64_t nt = nthreads > 0 ? nthreads : 1;
    int64_t chunk = (N + nt * 2 - 1) / (nt * 2); /* 2 chunks a thread, as linear_run */
    chunk = (chunk + RT - 1) / RT * RT;
    for (int64_t g0 = 0; g0 < B; g0 += XB) { /* 8 x rows (the screen's lanes) at a time */
        const int64_t gb = B - g0 < XB ? B - g0 : XB;
        quantise_x(x + g0 * K, gb, K, xq, xd, xn, xn + G);
        transpose_x(xq, xd, gb, K, xt, xd8);
        greedy_job j = {w, row_bytes, N, K, gb, chunk < 64 ? 64 : chunk, xq, xd, xt, xd8, sums,
                        out + g0 * N, isa, x + g0 * K, norms, xn, xn + G, ban_off + g0, ban_ids,
                        candidates == NULL ? NULL : candidates + g0};
        pool_run(nthreads, (N + j.chunk - 1) / j.chunk, screen_chunk, &j);
        pool_run(nthreads, gb, select_row, &j);
    }
    free(xq), free(xd), free(xn), free(xt), free(xd8);
    return 0;
}
