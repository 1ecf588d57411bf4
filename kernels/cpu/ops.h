/* Decode-step ops of the compiled CPU kernels: attention over the KV cache
 * (attention_decode.c, attention_prefill.c), RMS norm and RoPE (ops.c), their shared
 * float math in vec_math.h. Plain C (float32, lane-array loops the compiler vectorises
 * without reordering any sum) with AVX-512 twins of the same bits, the pool (pool.h) over
 * independent rows: a row's bits never depend on the batch. */
#ifndef PANTHEON_CPU_OPS_H
#define PANTHEON_CPU_OPS_H

#include <stdint.h>

#include "kv.h"

/* kv: the cache (kv.h), rows of any KV type; q (B, H, Dh); k, v (B, Hkv, Dh); out
 * (B, H * Dh). Writes row b's k/v at its slot and position, then attends. sinks: NULL,
 * or a logit per query head (H,) in each softmax's denominator (gpt-oss). */
void cpu_attention_decode(int nthreads, const float *q, const float *k, const float *v,
                          const kv_cache *kv, int64_t layer, const int64_t *slots,
                          const int64_t *positions, int64_t B, int64_t H, int64_t Hkv,
                          int64_t Dh, float scale, int64_t window, float softcap,
                          const float *sinks, float *out);

/* One sequence's prompt chunk: q (T, H, Dh), k/v (T, Hkv, Dh) at positions start ..
 * start + T - 1 of `slot`, written into the caches first; row t attends causally over
 * positions lo .. start + t (lo = start + t + 1 - window with a window, else 0). Blocked:
 * one job per (KV head, block of rows) reads each key and value once. Returns 0, or -1
 * when a job's scratch could not be allocated (the output is then incomplete). */
int cpu_attention_prefill(int nthreads, const float *q, const float *k, const float *v,
                          const kv_cache *kv, int64_t layer, int64_t slot, int64_t start,
                          int64_t T, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                          int64_t window, float softcap, const float *sinks, float *out);

void cpu_rms_norm(int nthreads, const float *x, const float *w, float eps, int64_t n, int64_t D,
                  float *out);

void cpu_rope(int nthreads, float *x, const int64_t *positions, const float *cos_t,
              const float *sin_t, int64_t n, int64_t H, int64_t Dh, int neox);

#endif
