/* A greedy row's token without its whole float32 logits (greedy.c). */
#ifndef PANTHEON_CPU_GREEDY_H
#define PANTHEON_CPU_GREEDY_H

#include <stddef.h>
#include <stdint.h>

/* 1 where greedy_logits has its int8 screen (AVX-512 VNNI); elsewhere it would still be
 * exact, but slower than the full product, so callers do not ask. */
int cpu_greedy_fast(int isa);

/* What the screen needs of a Q8_0 matrix, once: ||W_r||_2 of each of its N rows, rounded
 * up (float), and each block's sum of quants (N x K / 32). */
void cpu_greedy_prep_q8_0(const uint8_t *w, size_t row_bytes, int64_t N, int64_t K, float *norms,
                          int16_t *sums);

/* Logits of B rows of x against the N x K Q8_0 matrix w that keep each row's argmax: out[b]
 * holds, for every token that could be the largest allowed one, exactly the float32 value
 * cpu_linear computes for it, and -inf elsewhere (and at the banned ids of row b:
 * ban_ids[ban_off[b] .. ban_off[b + 1])). `norms`, `sums`: cpu_greedy_prep_q8_0 of w. A row whose
 * screen cannot decide (non-finite x, every token banned, too many candidates) is computed
 * whole, as cpu_linear would. Returns 0, or -1 when out of memory. */
int cpu_greedy_logits(int isa, int nthreads, const uint8_t *w, size_t row_bytes, int64_t N,
                      int64_t K, const float *norms, const int16_t *sums, const float *x,
                      int64_t B, const int64_t *ban_off, const int64_t *ban_ids, float *out,
                      int64_t *candidates);

#endif
