/* The threaded drivers of linear and dequantize (quants.h): a product's rows, or a
 * stacked matrix's parts, handed to the pool in chunks of whole row groups; the row
 * kernels they run come from linear.c (cpu_linear_pick, dequant_kernel). */
#include <stdlib.h>

#include "pool.h"
#include "quants.h"

/* Rows go to threads in fixed chunks of whole row groups (pool.h); each output element
 * is computed by one thread from start to end, so the thread count never changes a bit.
 * A job is one product's rows: the float32 kernel (fn), or the bfloat16 one (bf, with x
 * rounded into xb). */
typedef struct {
    linear_rows_fn fn;
    linear_bf_rows_fn bf;
    const uint8_t *w;
    size_t row_bytes;
    int64_t N, K, B, ldo, chunk;
    const float *x;
    const void *xb;
    float *out;
} linear_job;

static void linear_rows(const linear_job *j, int64_t r0, int64_t r1) {
    if (j->bf != NULL)
        j->bf(j->w, j->row_bytes, r0, r1, j->K, j->x, j->xb, j->B, j->out, j->ldo);
    else
        j->fn(j->w, j->row_bytes, r0, r1, j->K, j->x, j->B, j->out, j->ldo);
}

static void linear_chunk(void *ctx, int64_t i) {
    const linear_job *j = ctx;
    const int64_t r0 = i * j->chunk, r1 = r0 + j->chunk < j->N ? r0 + j->chunk : j->N;
    linear_rows(j, r0, r1);
}

/* Small products stay on the calling thread (handing them out costs more than they do);
 * others go out in 2 chunks per thread, each a multiple of the 4-row group and at least
 * 16 rows. Each chunk claimed costs a compare-and-swap and an add on lines both cores
 * write, and a chunk of a small matrix (36 rows, 13 KB of a 576 x 576 Q4_1 one) is too
 * short a stream for the hardware prefetcher: SmolLM2's decode step in process, 2
 * threads, measured in turns, B = 1 / 2 / 8: 5.18 / 6.25 / 17.8 ms with 8 chunks per
 * thread, 4.49 / 5.64 / 16.9 with 2, 4.36 / 5.54 / 16.7 with 1. Two rather than one: a
 * worker the OS preempts mid-chunk holds a quarter of the product, not half. */
#define CHUNKS_PER_THREAD 2

/* Whether a product of `bytes` of weights by B x rows is small enough for one thread. */
static int single_threaded(double bytes, int64_t B) {
    return bytes * (double)(B < 4 ? 1 : B / 4) < 65536.0;
}

/* The rows of a chunk when `rows` go out in n chunks: whole 4-row groups, at least 16. */
static int64_t chunk_rows(int64_t rows, int64_t n) {
    const int64_t chunk = ((rows + n - 1) / n + 3) & ~(int64_t)3;
    return chunk < 16 ? 16 : chunk;
}

static void linear_run(linear_job *j, int nthreads) {
    if (nthreads <= 1 || single_threaded((double)j->N * (double)j->row_bytes, j->B)) {
        linear_rows(j, 0, j->N);
        return;
    }
    j->chunk = chunk_rows(j->N, (int64_t)nthreads * CHUNKS_PER_THREAD);
    pool_run(nthreads, (j->N + j->chunk - 1) / j->chunk, linear_chunk, j);
}

/* Several products of one x as one pool run. Each part is cut at multiples of 4 rows
 * from its own first row, as linear_run cuts a matrix, into chunks in proportion to its
 * bytes (2 per thread in all, at least one per part): a layer's q, k and v (207, 69 and
 * 69 KB for SmolLM2) go out as 4 chunks, not 12, and the threads meet once, not 3 times. */
#define MAX_PARTS 8
typedef struct {
    linear_job job[MAX_PARTS];
    int64_t first[MAX_PARTS + 1]; /* chunk indices of part p: first[p] .. first[p + 1] */
} parts_job;

static void parts_chunk(void *ctx, int64_t i) {
    parts_job *pj = ctx;
    int p = 0;
    while (i >= pj->first[p + 1])
        p++;
    linear_chunk(&pj->job[p], i - pj->first[p]);
}

void cpu_linear_parts(int isa, int nthreads, int n_parts, const linear_part *parts, int64_t K,
                      const float *x, int64_t B, float *out, int64_t ldo) {
    double bytes = 0.0;
    int fused = n_parts > 1 && n_parts <= MAX_PARTS && nthreads > 1 && B > 0 &&
                cpu_activations(isa) == ACT_FLOAT32;
    for (int p = 0; fused && p < n_parts; p++) {
        fused = parts[p].rows > 0 && linear_kernel(isa, parts[p].qt) != NULL;
        bytes += (double)parts[p].rows * (double)parts[p].row_bytes;
    }
    if (!fused || single_threaded(bytes, B)) {
        for (int p = 0; p < n_parts; p++)
            cpu_linear(isa, nthreads, parts[p].qt, parts[p].w, parts[p].row_bytes, parts[p].rows,
                       K, x, B, out + parts[p].col0, ldo);
        return;
    }
    parts_job pj;
    pj.first[0] = 0;
    const double total_chunks = (double)nthreads * CHUNKS_PER_THREAD;
    for (int p = 0; p < n_parts; p++) {
        const linear_part *lp = &parts[p];
        const double share = (double)lp->rows * (double)lp->row_bytes / bytes;
        const int64_t n = (int64_t)(total_chunks * share + 0.5);
        const int64_t chunk = chunk_rows(lp->rows, n < 1 ? 1 : n);
        pj.job[p] = (linear_job){linear_kernel(isa, lp->qt), NULL, lp->w, lp->row_bytes,
                                 lp->rows, K, B, ldo, chunk, x, NULL, out + lp->col0};
        pj.first[p + 1] = pj.first[p] + (lp->rows + chunk - 1) / chunk;
    }
    pool_run(nthreads, pj.first[n_parts], parts_chunk, &pj);
}

void cpu_linear(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes, int64_t N,
                int64_t K, const float *x, int64_t B, float *out, int64_t ldo) {
    const linear_pick pick = cpu_linear_pick(isa, qt);
    if (pick.fn == NULL || N <= 0 || B <= 0)
        return;
    linear_job job = {pick.fn, NULL, w, row_bytes, N, K, B, ldo, 0, x, NULL, out};
    /* bfloat16 products: x rounded once per call. Where the type has no such kernel or
     * the buffer cannot be had, the float32 product runs. */
    const int64_t nch = K / 32;
    void *xb = NULL;
    if (pick.bf != NULL && (nch == 0 || posix_memalign(&xb, 64, (size_t)(B * nch) * 64) == 0)) {
        cpu_linear_round_x(isa, x, B, K, xb);
        job.bf = pick.bf;
        job.xb = xb;
        linear_run(&job, nthreads);
        free(xb);
        return;
    }
    linear_run(&job, nthreads);
}

typedef struct {
    dequant_row_fn fn;
    const uint8_t *w;
    size_t row_bytes;
    int64_t R, K, chunk;
    float *out;
} dequant_job;

static void dequant_chunk(void *ctx, int64_t i) {
    const dequant_job *j = ctx;
    const int64_t r1 = (i + 1) * j->chunk < j->R ? (i + 1) * j->chunk : j->R;
    for (int64_t r = i * j->chunk; r < r1; r++)
        j->fn(j->w + r * j->row_bytes, j->K, j->out + r * j->K);
}

void cpu_dequantize(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes,
                    int64_t R, int64_t K, float *out) {
    dequant_row_fn fn = dequant_kernel(isa, qt);
    if (fn == NULL || R <= 0)
        return;
    int64_t chunk = R;
    if (nthreads > 1 && (double)R * (double)K >= 65536.0) {
        chunk = (R + (int64_t)nthreads * 4 - 1) / ((int64_t)nthreads * 4);
        if (chunk * K < 8192)
            chunk = (8192 + K - 1) / K;
    }
    dequant_job job = {fn, w, row_bytes, R, K, chunk, out};
    pool_run(nthreads, (R + chunk - 1) / chunk, dequant_chunk, &job);
}
