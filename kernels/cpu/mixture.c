/* See mixture.h. The per-op path (kernels/cpu/backend.py: CpuBackend.mixture with the
 * expert products of engine/models/_moe.py) computes the same values with the same
 * kernels: routing here (cpu_moe_route, called from Python too), each expert's product
 * over its rows through the row kernel cpu_linear picks, cpu_glu, and the rank-order sum
 * as float32 multiplies and adds (-ffp-contract=off: no fused multiply-add). What this
 * file removes is a Python call and a fork/join of the thread pool per expert product. */
#include "mixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quants.h"
#include "scratch.h"

/* ------------------------------------------------------------------ routing */

/* The k largest of p (n), best first; ties go to the lower index (a stable sort's order). */
static void top_k(const double *p, int64_t n, int64_t k, int64_t *chosen) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j; i++)
                taken |= chosen[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        chosen[j] = best;
    }
}

int cpu_moe_route(const float *logits, int64_t n, int64_t E, int64_t k, int gating,
                  int norm_topk, float scale, int64_t *chosen, float *weights) {
    double *p = malloc((size_t)(E + k) * sizeof(double)); /* the E scores, then the k */
    if (p == NULL)
        return -1;
    double *w = p + E;
    for (int64_t r = 0; r < n; r++) {
        const float *z = logits + r * E;
        int64_t *c = chosen + r * k;
        for (int64_t e = 0; e < E; e++)
            p[e] = (double)z[e];
        if (gating == GATE_SOFTMAX_TOPK) { /* the k best logits, softmaxed */
            top_k(p, E, k, c);
            double sum = 0.0;
            for (int64_t j = 0; j < k; j++)
                sum += w[j] = exp(p[c[j]] - p[c[0]]);
            for (int64_t j = 0; j < k; j++)
                weights[r * k + j] = (float)(w[j] / sum * (double)scale);
            continue;
        }
        if (gating == GATE_SOFTMAX) {
            double top = p[0], sum = 0.0;
            for (int64_t e = 1; e < E; e++)
                top = p[e] > top ? p[e] : top;
            for (int64_t e = 0; e < E; e++)
                sum += p[e] = exp(p[e] - top);
            for (int64_t e = 0; e < E; e++)
                p[e] /= sum;
        } else {
            for (int64_t e = 0; e < E; e++)
                p[e] = 1.0 / (1.0 + exp(-p[e]));
        }
        top_k(p, E, k, c);
        double sum = 0.0;
        for (int64_t j = 0; j < k; j++)
            sum += w[j] = p[c[j]];
        for (int64_t j = 0; j < k; j++) {
            double v = norm_topk ? w[j] / sum : w[j];
            weights[r * k + j] = (float)(v * (double)scale);
        }
    }
    free(p);
    return 0;
}

/* ------------------------------------------------------------------ grouped products */

/* Rows [r0, r1) of one part of one expert's matrix, for that expert's m gathered rows. */
typedef struct {
    linear_pick kern;
    const dec_part *part;
    int64_t K, m, ldo, r0, r1;
    const float *x;
    const uint8_t *xb; /* x rounded to bfloat16 (for kern.bf) */
    float *out;        /* the expert's first output row, at the part's column */
} moe_task;

static void run_task(void *ctx, int64_t i) {
    const moe_task *t = (const moe_task *)ctx + i;
    const dec_part *p = t->part;
    if (t->kern.bf != NULL)
        t->kern.bf(p->w, p->row_bytes, t->r0, t->r1, t->K, t->x, t->xb, t->m, t->out, t->ldo);
    else
        t->kern.fn(p->w, p->row_bytes, t->r0, t->r1, t->K, t->x, t->m, t->out, t->ldo);
}

/* One phase: for every expert e with cnt[e] > 0 rows (gathered from row off[e] of x, K
 * wide), out[off[e]:, :N] = x_e @ mats[e].T, all products in one parallel region. Tasks
 * are blocks of a part's output rows (a multiple of 4, ~8 per thread), spread over the
 * threads; an output's bits do not depend on the block it falls in. */
static int grouped_products(int isa, int nt, const dec_matrix *mats, int64_t E,
                            const int64_t *cnt, const int64_t *off, const float *x,
                            const uint8_t *xb, int64_t K, float *out, moe_task *tasks) {
    const size_t xb_row = (size_t)(K / 32) * 64;
    int64_t total = 0;
    for (int64_t e = 0; e < E; e++)
        if (cnt[e] > 0)
            total += mats[e].N;
    int64_t chunk = (total + (int64_t)nt * 8 - 1) / ((int64_t)nt * 8);
    chunk = (chunk + 3) & ~(int64_t)3;
    if (chunk < 16)
        chunk = 16;
    if (nt <= 1)
        chunk = INT64_MAX / 2; /* one task per part: nothing to hand out */
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        if (cnt[e] == 0)
            continue;
        const dec_matrix *M = &mats[e];
        for (int p = 0; p < M->n_parts; p++) {
            const dec_part *part = &M->part[p];
            linear_pick kern = cpu_linear_pick(isa, part->qt);
            if (kern.fn == NULL)
                return -1;
            if (xb == NULL) /* float32 activations */
                kern.bf = NULL;
            for (int64_t r0 = 0; r0 < part->rows; r0 += chunk)
                tasks[n++] = (moe_task){kern,
                                        part,
                                        K,
                                        cnt[e],
                                        M->N,
                                        r0,
                                        r0 + chunk < part->rows ? r0 + chunk : part->rows,
                                        x + off[e] * K,
                                        xb != NULL ? xb + (size_t)off[e] * xb_row : NULL,
                                        out + off[e] * M->N + part->col0};
        }
    }
    pool_run(nt, n, run_task, tasks);
    return 0;
}

/* The most tasks grouped_products makes for any choice of experts. */
static int64_t max_tasks(const dec_matrix *mats, int64_t E, int64_t used, int nt) {
    int64_t widest = 0;
    for (int64_t e = 0; e < E; e++)
        widest = mats[e].N > widest ? mats[e].N : widest;
    return (widest * used) / 16 + used * DECODE_MAX_PARTS + (int64_t)nt * 8 + 1;
}

/* A bump allocator over one 64-byte aligned block. */
typedef struct {
    uint8_t *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes) {
    void *p = a->base + a->used;
    a->used += (bytes + 63) & ~(size_t)63;
    return p;
}

int cpu_moe_ffn(int isa, int nt, const dec_moe *m, int act, const float *h, int64_t B,
                int64_t D, float *out) {
    const int64_t E = m->E, k = m->k, F = m->F, n = B * k, Fs = m->Fs;
    const int64_t used = n < E ? n : E;
    const int64_t n_tasks = max_tasks(m->gate_up, E, used, nt) + max_tasks(m->down, E, used, nt);
    const size_t f = sizeof(float), i64 = sizeof(int64_t);
    /* n = B * k (row, expert) pairs; "gathered": their rows, grouped by expert. */
    const size_t sizes[] = {
        (size_t)(B * E) * f,               /* 0 logits */
        (size_t)n * i64,                   /* 1 chosen */
        (size_t)n * f,                     /* 2 weights */
        (size_t)(2 * E) * i64,             /* 3 rows per expert, first gathered row */
        (size_t)n * i64,                   /* 4 each pair's gathered row */
        (size_t)(n * D) * f,               /* 5 gathered inputs */
        (size_t)n * (size_t)(D / 32) * 64, /* 6 ... rounded to bfloat16 */
        (size_t)(n * 2 * F) * f,           /* 7 gate/up outputs */
        (size_t)(n * F) * f,               /* 8 GLU outputs */
        (size_t)n * (size_t)(F / 32) * 64, /* 9 ... rounded to bfloat16 */
        (size_t)(n * D) * f,               /* 10 down outputs (and the shared expert's) */
        (size_t)(B * 3 * Fs) * f,          /* 11 the shared expert's gate/up and GLU */
        (size_t)n_tasks * sizeof(moe_task) /* 12 */
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        total += (sizes[i] + 63) & ~(size_t)63;
    arena a = {scratch_take(SCRATCH_MIXTURE, total), 0};
    if (a.base == NULL)
        return -1;
    float *logits = take(&a, sizes[0]), *weights;
    int64_t *chosen = take(&a, sizes[1]);
    weights = take(&a, sizes[2]);
    int64_t *cnt = take(&a, sizes[3]), *off = cnt + E, *slot = take(&a, sizes[4]);
    float *xg = take(&a, sizes[5]);
    uint8_t *xb = take(&a, sizes[6]);
    float *gu = take(&a, sizes[7]), *g = take(&a, sizes[8]);
    uint8_t *gb = take(&a, sizes[9]);
    float *y = take(&a, sizes[10]), *sgu = take(&a, sizes[11]), *sg = sgu + B * 2 * Fs;
    moe_task *tasks = take(&a, sizes[12]);
    int rc = 0;

    dec_matmul(isa, nt, &m->router, h, B, logits);
    if (m->router_bias != NULL)
        for (int64_t b = 0; b < B; b++)
            for (int64_t e = 0; e < E; e++)
                logits[b * E + e] = logits[b * E + e] + m->router_bias[e];
    if (cpu_moe_route(logits, B, E, k, m->gating, m->norm_topk, m->scale, chosen, weights)) {
        rc = -1;
        goto done;
    }

    /* Group by expert (ascending id), each expert's rows ascending; gather their inputs. */
    memset(cnt, 0, (size_t)E * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        cnt[chosen[i]]++;
    for (int64_t e = 0, at = 0; e < E; e++) {
        off[e] = at;
        at += cnt[e];
        cnt[e] = 0; /* refilled below */
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t e = chosen[b * k + j], s = off[e] + cnt[e]++;
            slot[b * k + j] = s;
            memcpy(xg + s * D, h + b * D, (size_t)D * f);
        }
    const int round_gu = cpu_linear_round_x(isa, xg, n, D, xb);
    if (grouped_products(isa, nt, m->gate_up, E, cnt, off, xg, round_gu ? xb : NULL, D, gu,
                         tasks)) {
        rc = -1;
        goto done;
    }
    cpu_glu(gu, n, F, act, g);
    const int round_down = cpu_linear_round_x(isa, g, n, F, gb);
    if (grouped_products(isa, nt, m->down, E, cnt, off, g, round_down ? gb : NULL, F, y,
                         tasks)) {
        rc = -1;
        goto done;
    }

    /* Each row's k outputs in rank order (the highest weight first). */
    for (int64_t b = 0; b < B; b++) {
        float *o = out + b * D;
        const float *y0 = y + slot[b * k] * D, w0 = weights[b * k];
        for (int64_t i = 0; i < D; i++)
            o[i] = y0[i] * w0;
        for (int64_t j = 1; j < k; j++) {
            const float *yj = y + slot[b * k + j] * D, wj = weights[b * k + j];
            for (int64_t i = 0; i < D; i++)
                o[i] = o[i] + yj[i] * wj;
        }
    }
    if (Fs > 0) { /* the shared expert, added unweighted */
        dec_matmul(isa, nt, &m->shared_gate_up, h, B, sgu);
        cpu_glu(sgu, B, Fs, act, sg);
        dec_matmul(isa, nt, &m->shared_down, sg, B, y);
        for (int64_t i = 0; i < B * D; i++)
            out[i] = out[i] + y[i];
    }
done:
    scratch_give_back(SCRATCH_MIXTURE, a.base);
    return rc;
}
