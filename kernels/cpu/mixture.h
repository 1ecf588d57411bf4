/* A mixture-of-experts FFN for B rows in a few compiled calls: router product, routing
 * (the same rule as kernels/moe.py), then every chosen expert's gate/up products in ONE
 * parallel region, the GLU, every down product in one more, and each row's sum over its
 * k outputs in rank order. A row's bits are the same alone or in any batch, and for any
 * thread count: each product row is the row kernel cpu_linear runs (linear.c: nothing in
 * an output's arithmetic depends on which rows or threads share the call). */
#ifndef PANTHEON_CPU_MIXTURE_H
#define PANTHEON_CPU_MIXTURE_H

#include <stdint.h>

#include "decode.h"

enum { GATE_SOFTMAX = 0, GATE_SIGMOID = 1, GATE_SOFTMAX_TOPK = 2 };

/* Each row's k experts, best first, and their float32 weights, from its E router logits:
 * in float64, a softmax (or sigmoid) over all E, the k largest (ties to the lower id),
 * renormalised to sum 1 with norm_topk; or (GATE_SOFTMAX_TOPK) the k largest logits,
 * softmaxed among themselves; then times scale. Returns 0, or -1 without memory. */
int cpu_moe_route(const float *logits, int64_t n, int64_t E, int64_t k, int gating,
                  int norm_topk, float scale, int64_t *chosen, float *weights);

/* out (B, D) = sum_j w_j expert_{e_j}(h), plus the shared expert's output where Fs > 0.
 * Returns 0, or -1 when scratch memory could not be had. */
int cpu_moe_ffn(int isa, int nthreads, const dec_moe *m, int act, const float *h, int64_t B,
                int64_t D, float *out);

#endif
