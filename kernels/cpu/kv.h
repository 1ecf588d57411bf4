/* The KV cache's storage types (the `kv_dtype` load option): a cache row is one position
 * of one KV head, stored as Dh float32 values (exact, the default), Dh float16 values, or
 * Dh / 32 Q8_0 blocks (GGUF's layout: an f16 scale and 32 int8 values). Rows are written
 * through kv_store_row and read back a few at a time into a float32 tile (kv_rows_f32)
 * that the attention kernels then use from L1: the cache itself is read in its own type,
 * never copied whole into float32. */
#ifndef PANTHEON_CPU_KV_H
#define PANTHEON_CPU_KV_H

#include <stdint.h>

enum { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 };

#define KV_QK 32 /* values per Q8_0 block */

/* One model's cache: k and v (n_layer, n_slots, Hkv, n_ctx, row) of `type`. */
typedef struct {
    void *k, *v;
    int type;
    int64_t n_slots, n_ctx;
} kv_cache;

/* Bytes of one row of Dh values (Dh a multiple of KV_QK for Q8_0). */
int64_t kv_row_bytes(int type, int64_t Dh);

/* Store Dh float32 values as one row: a copy, float16 rounded to nearest even, or Q8_0
 * (d = max|x| / 127 rounded to f16 afterwards, q = roundf(x / d), as numpy's twin in
 * kernels/kv_cache.py). */
void kv_store_row(int type, const float *src, int64_t Dh, void *dst);

/* n consecutive rows starting at `rows` into dst (n, Dh) float32: exact conversions
 * (float16 -> float32, d * q for Q8_0), so every reader sees the same values whatever
 * the SIMD level converts them. */
void kv_rows_f32(int type, const void *rows, int64_t n, int64_t Dh, float *dst);

/* The SIMD level the conversions use (quants.h's ISA_*; the module's, at import). */
void kv_set_isa(int isa);

/* Decode attention's two products straight from float16 or Q8_0 rows, converting each
 * row in registers (AVX-512, Dh a multiple of 16 up to 256; the caller checks): scores[t]
 * = qs . key t, and out = sum_t (w[t] * inv) * value t. Each value is converted exactly,
 * so the products are those of the same float32 values. */
void kv_scores_avx512(int type, const float *qs, const void *keys, int64_t n, int64_t Dh,
                      float *scores);
void kv_weighted_avx512(int type, const float *w, const void *values, int64_t n, int64_t Dh,
                        float inv, float *out);

#endif
