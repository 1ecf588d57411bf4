/* Prefill product (a prompt chunk of T tokens times a weight matrix in GGUF blocks): jobs
 * on the pool are tiles of weight rows, each dequantised into a per-thread buffer that
 * stays in L2, then multiplied by every token with a register-blocked micro-kernel. No
 * BLAS. Each output is computed by one job, with arithmetic fixed by (x[t], W[r], K)
 * alone: the bits do not depend on T, the other rows, the tile size or the thread count. */
#ifndef PANTHEON_CPU_PREFILL_H
#define PANTHEON_CPU_PREFILL_H

#include <stddef.h>
#include <stdint.h>

/* out[t * ldo + r] = sum_k W[r, k] * x[t * K + k] for r in [0, N), t in [0, T); `out`
 * already points at column col0. Returns 0, or -1 when a buffer could not be allocated. */
int cpu_linear_prefill(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes,
                       int64_t N, int64_t K, const float *x, int64_t T, float *out, int64_t ldo);

#endif
