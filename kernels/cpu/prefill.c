/* The prefill product (see prefill.h). A job is a tile of R weight rows: its rows are
 * dequantised (the `dequantize` kernels, bitwise gguf-py's values) into a per-thread,
 * 64-byte aligned buffer of R x Kp floats (rows zero-padded to Kp, a multiple of 16)
 * that stays in L2, then a micro-kernel computes MT tokens x 4 rows at a time: one vector
 * accumulator per (token, row), lanes over k, FMAs in k order, then one fixed reduction of
 * the lanes (four rows' sums at once). K is walked in blocks of PF_KC values (x's block
 * then stays in L1); the blocks' sums are added to the output in block order. So an
 * output's arithmetic depends only on x[t], W[r] and K: not on T, MT, the other rows,
 * the tile, the thread count. Build with -ffp-contract=off (every FMA is explicit). */
#include "prefill.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quants.h"

/* Values per K block (a multiple of 16): MT x PF_KC floats of x stay in L1. */
#ifndef PF_KC
#define PF_KC 512
#endif
/* Floats of dequantised weights per tile (the job): the tile stays in L2. */
#ifndef PF_TILE_FLOATS
#define PF_TILE_FLOATS (48 << 10)
#endif
#define PF_MAX_ROWS 64
/* Chunks of at most this many tokens go through the decode kernel (cpu_linear). */
#define PF_DIRECT_T 4

typedef void (*ptile_fn)(const float *wt, int64_t Kp, int64_t nr, const float *x, int64_t T,
                         float *out, int64_t ldo);

#define AI static inline __attribute__((always_inline))

/* Write (add == 0) or add (add == 1, a later K block) the sums of rows [0, ng) of a group. */
#define STORE4(dst, s, ng, add)                                                                  \
    do {                                                                                         \
        float s_[4];                                                                             \
        memcpy(s_, &(s), sizeof s_);                                                             \
        for (int r_ = 0; r_ < (ng); r_++)                                                        \
            (dst)[r_] = (add) ? (dst)[r_] + s_[r_] : s_[r_];                                     \
    } while (0)

/* ------------------------------------------------------------------ portable C */

#define GL 16
#define GEN_MT 4

AI float gen_reduce(const float *a) {
    float h[8];
    for (int l = 0; l < 8; l++)
        h[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++)
        h[l] = h[l] + h[l + 4];
    return (h[0] + h[2]) + (h[1] + h[3]);
}

AI void gen_mk(const int MT, const float *x, int64_t Kp, const float *w, int64_t k0, int64_t k1,
               float *out, int64_t ldo, int ng, int add) {
    float acc[GEN_MT][4][GL];
    memset(acc, 0, sizeof acc);
    for (int64_t k = k0; k < k1; k += GL)
        for (int t = 0; t < MT; t++)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < GL; l++)
                    acc[t][r][l] += x[t * Kp + k + l] * w[r * Kp + k + l];
    for (int t = 0; t < MT; t++) {
        float s[4];
        for (int r = 0; r < 4; r++)
            s[r] = gen_reduce(acc[t][r]);
        STORE4(out + t * ldo, s, ng, add);
    }
}

static void tile_generic(const float *wt, int64_t Kp, int64_t nr, const float *x, int64_t T,
                         float *out, int64_t ldo) {
    for (int64_t k0 = 0; k0 < Kp; k0 += PF_KC) {
        const int64_t k1 = k0 + PF_KC < Kp ? k0 + PF_KC : Kp;
        for (int64_t t0 = 0; t0 < T; t0 += GEN_MT) {
            const int mt = T - t0 < GEN_MT ? (int)(T - t0) : GEN_MT;
            for (int64_t g = 0; g < nr; g += 4) {
                const int ng = nr - g < 4 ? (int)(nr - g) : 4;
                const float *xb = x + t0 * Kp, *wb = wt + g * Kp;
                float *ob = out + t0 * ldo + g;
                switch (mt) {
                case 1: gen_mk(1, xb, Kp, wb, k0, k1, ob, ldo, ng, k0 > 0); break;
                case 2: gen_mk(2, xb, Kp, wb, k0, k1, ob, ldo, ng, k0 > 0); break;
                case 3: gen_mk(3, xb, Kp, wb, k0, k1, ob, ldo, ng, k0 > 0); break;
                default: gen_mk(4, xb, Kp, wb, k0, k1, ob, ldo, ng, k0 > 0); break;
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ x86 SIMD */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PF_X86 1
#include <immintrin.h>

/* The tile loops, one body for both ISAs: MT tokens per micro-kernel call. */
#define TILE_BODY(MK, MTMAX)                                                                     \
    for (int64_t k0 = 0; k0 < Kp; k0 += PF_KC) {                                                 \
        const int64_t k1 = k0 + PF_KC < Kp ? k0 + PF_KC : Kp;                                    \
        const int add = k0 > 0;                                                                  \
        for (int64_t t0 = 0; t0 < T; t0 += MTMAX) {                                              \
            const int mt = T - t0 < MTMAX ? (int)(T - t0) : MTMAX;                               \
            const float *xb = x + t0 * Kp;                                                       \
            for (int64_t g = 0; g < nr; g += 4) {                                                \
                const int ng = nr - g < 4 ? (int)(nr - g) : 4;                                   \
                const float *wb = wt + g * Kp;                                                   \
                float *ob = out + t0 * ldo + g;                                                  \
                MK_SWITCH(MK)                                                                    \
            }                                                                                    \
        }                                                                                        \
    }

/* --- AVX2 + FMA: 8 lanes, 3 tokens x 4 rows = 12 accumulators (+ 3 x vectors) */
#define T256 __attribute__((target("avx2,fma")))
#define MT256 3

T256 AI __m128 red4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
    /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [A, B, C, D] */
    const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const __m256 s = _mm256_add_ps(
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))),
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

T256 AI void mk_256(const int MT, const float *x, int64_t Kp, const float *w, int64_t k0,
                    int64_t k1, float *out, int64_t ldo, int ng, int add) {
    __m256 acc[MT256][4];
#pragma GCC unroll 4
    for (int t = 0; t < MT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            acc[t][r] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; k += 8) {
        __m256 xv[MT256];
#pragma GCC unroll 4
        for (int t = 0; t < MT; t++)
            xv[t] = _mm256_loadu_ps(x + t * Kp + k);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m256 wv = _mm256_load_ps(w + r * Kp + k);
#pragma GCC unroll 4
            for (int t = 0; t < MT; t++)
                acc[t][r] = _mm256_fmadd_ps(xv[t], wv, acc[t][r]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < MT; t++) {
        __m128 s = red4_256(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        float *o = out + t * ldo;
        if (ng == 4) {
            if (add)
                s = _mm_add_ps(_mm_loadu_ps(o), s);
            _mm_storeu_ps(o, s);
        } else {
            STORE4(o, s, ng, add);
        }
    }
}

#define MK_SWITCH(MK)                                                                            \
    switch (mt) {                                                                                \
    case 1: MK(1, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    case 2: MK(2, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    default: MK(3, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                 \
    }

T256 static void tile_avx2(const float *wt, int64_t Kp, int64_t nr, const float *x, int64_t T,
                           float *out, int64_t ldo) {
    TILE_BODY(mk_256, MT256)
}
#undef MK_SWITCH

/* --- AVX-512: 16 lanes, 6 tokens x 4 rows = 24 accumulators (+ 6 x vectors) */
#define T512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define MT512 6

T512 AI __m128 red4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 s = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

T512 AI void mk_512(const int MT, const float *x, int64_t Kp, const float *w, int64_t k0,
                    int64_t k1, float *out, int64_t ldo, int ng, int add) {
    __m512 acc[MT512][4];
#pragma GCC unroll 8
    for (int t = 0; t < MT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            acc[t][r] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k += 16) {
        __m512 xv[MT512];
#pragma GCC unroll 8
        for (int t = 0; t < MT; t++)
            xv[t] = _mm512_loadu_ps(x + t * Kp + k);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m512 wv = _mm512_load_ps(w + r * Kp + k);
#pragma GCC unroll 8
            for (int t = 0; t < MT; t++)
                acc[t][r] = _mm512_fmadd_ps(xv[t], wv, acc[t][r]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < MT; t++) {
        __m128 s = red4_512(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
        float *o = out + t * ldo;
        if (ng == 4) {
            if (add)
                s = _mm_add_ps(_mm_loadu_ps(o), s);
            _mm_storeu_ps(o, s);
        } else {
            STORE4(o, s, ng, add);
        }
    }
}

#define MK_SWITCH(MK)                                                                            \
    switch (mt) {                                                                                \
    case 1: MK(1, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    case 2: MK(2, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    case 3: MK(3, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    case 4: MK(4, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    case 5: MK(5, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                  \
    default: MK(6, xb, Kp, wb, k0, k1, ob, ldo, ng, add); break;                                 \
    }

T512 static void tile_avx512(const float *wt, int64_t Kp, int64_t nr, const float *x, int64_t T,
                             float *out, int64_t ldo) {
    TILE_BODY(mk_512, MT512)
}
#undef MK_SWITCH

#endif /* x86 */

static ptile_fn tile_for(int isa) {
#ifdef PF_X86
    if (isa == ISA_AVX512)
        return tile_avx512;
    if (isa == ISA_AVX2)
        return tile_avx2;
#endif
    (void)isa;
    return tile_generic;
}

/* ------------------------------------------------------------------ per-thread buffer */

typedef struct {
    float *p;
    size_t n;
} tbuf;

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_ok = 0;

static void tbuf_free(void *v) {
    tbuf *b = v;
    free(b->p);
    free(b);
}

static void key_init(void) { g_key_ok = pthread_key_create(&g_key, tbuf_free) == 0; }

/* This thread's buffer of at least n floats (64-byte aligned; freed when the thread
 * exits), or NULL when memory runs out. */
static float *thread_buf(size_t n) {
    pthread_once(&g_once, key_init);
    if (!g_key_ok)
        return NULL;
    tbuf *b = pthread_getspecific(g_key);
    if (b == NULL) {
        b = calloc(1, sizeof *b);
        if (b == NULL)
            return NULL;
        if (pthread_setspecific(g_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (b->n < n) {
        void *p = NULL;
        free(b->p);
        b->p = NULL;
        b->n = 0;
        if (posix_memalign(&p, 64, n * sizeof(float)) != 0)
            return NULL;
        b->p = p;
        b->n = n;
    }
    return b->p;
}

/* ------------------------------------------------------------------ driver */

typedef struct {
    dequant_row_fn deq;
    ptile_fn tile;
    const uint8_t *w;
    size_t row_bytes;
    int64_t N, K, Kp, R, T, ldo;
    const float *x; /* (T, Kp) */
    float *out;
    _Atomic int failed;
} prefill_job;

static void prefill_tile_job(void *ctx, int64_t i) {
    prefill_job *j = ctx;
    const int64_t r0 = i * j->R, nr = j->N - r0 < j->R ? j->N - r0 : j->R;
    const int64_t Rp = (nr + 3) & ~(int64_t)3, Kp = j->Kp, K = j->K;
    float *wt = thread_buf((size_t)(Rp * Kp));
    if (wt == NULL) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int64_t r = 0; r < nr; r++) {
        float *row = wt + r * Kp;
        j->deq(j->w + (size_t)(r0 + r) * j->row_bytes, K, row);
        for (int64_t k = K; k < Kp; k++)
            row[k] = 0.f;
    }
    if (Rp > nr) /* the last group's missing rows: zeros (their sums are not stored) */
        memset(wt + nr * Kp, 0, (size_t)((Rp - nr) * Kp) * sizeof(float));
    j->tile(wt, Kp, nr, j->x, j->T, j->out + r0, j->ldo);
}

int cpu_linear_prefill(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes,
                       int64_t N, int64_t K, const float *x, int64_t T, float *out, int64_t ldo) {
    if (N <= 0 || T <= 0)
        return 0;
    if (T <= PF_DIRECT_T) {
        cpu_linear(isa, nthreads, qt, w, row_bytes, N, K, x, T, out, ldo);
        return 0;
    }
    dequant_row_fn deq = dequant_kernel(isa, qt);
    if (deq == NULL)
        return 0;
    const int64_t Kp = (K + 15) & ~(int64_t)15;
    float *xpad = NULL;
    if (Kp != K) { /* rows of x padded with zeros to Kp (float types with odd K only) */
        void *p = NULL;
        if (posix_memalign(&p, 64, (size_t)(T * Kp) * sizeof(float)) != 0)
            return -1;
        xpad = p;
        for (int64_t t = 0; t < T; t++) {
            memcpy(xpad + t * Kp, x + t * K, (size_t)K * sizeof(float));
            memset(xpad + t * Kp + K, 0, (size_t)(Kp - K) * sizeof(float));
        }
    }
    /* Rows per tile: at most what fits PF_TILE_FLOATS (a multiple of 4, in [4,
     * PF_MAX_ROWS]), then evened out so that the number of tiles is a multiple of the
     * thread count (576 rows: 10 tiles of 60 rather than 9 of 64, which leave one thread
     * a tile to run alone). Any split gives the same bits. */
    int64_t R = PF_TILE_FLOATS / Kp / 4 * 4;
    R = R < 4 ? 4 : R > PF_MAX_ROWS ? PF_MAX_ROWS : R;
    if (nthreads > 1) {
        int64_t tiles = (N + R - 1) / R;
        tiles = (tiles + nthreads - 1) / nthreads * nthreads;
        R = ((N + tiles - 1) / tiles + 3) & ~(int64_t)3;
    }
    prefill_job job = {deq, tile_for(isa), w, row_bytes, N, K, Kp, R, T, ldo,
                       xpad ? xpad : x, out, 0};
    pool_run(nthreads, (N + R - 1) / R, prefill_tile_job, &job);
    free(xpad);
    return atomic_load(&job.failed) ? -1 : 0;
}
