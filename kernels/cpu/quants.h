/* Compiled CPU kernels for Pantheon (kernels._cpu): shared declarations.
 *
 * Weights stay in their GGUF blocks; every kernel decodes a block's quants to float32
 * once and multiplies them against float32 activations (activations are never
 * quantised). Row (b, r) of a product always goes through the same sequence of float
 * operations whatever the batch size, the other rows or the thread count: the batch
 * and thread invariance the engine's decode relies on. */
#ifndef PANTHEON_CPU_QUANTS_H
#define PANTHEON_CPU_QUANTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_BF16 = 30,
    QT_MXFP4 = 39,
    QT_MAX = 40
};

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_COUNT = 3 };

/* Name of a supported type, or NULL. Block size (values) and type size (bytes). */
const char *qt_name(int qt);
int qt_block(int qt);
int qt_tsize(int qt);

/* Rows [r0, r1) of W (row_bytes apart) times x (B, K): out[b * ldo + r] for r in
 * [r0, r1). `out` already points at column col0. */
typedef void (*linear_rows_fn)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                               int64_t K, const float *x, int64_t B, float *out, int64_t ldo);
/* The same rows from bfloat16 products (linear_simd.h, BF16DOT): xb is x rounded to
 * bfloat16, 32 values per 64-byte vector, K / 32 vectors per row; x itself serves the
 * float tail of F32/F16/BF16 rows whose K is not a multiple of 32. */
typedef void (*linear_bf_rows_fn)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                  int64_t K, const float *x, const void *xb, int64_t B,
                                  float *out, int64_t ldo);
/* One row of K values, decoded exactly as gguf-py's dequantizer computes them. */
typedef void (*dequant_row_fn)(const uint8_t *row, int64_t K, float *out);

linear_rows_fn linear_kernel(int isa, int qt);
dequant_row_fn dequant_kernel(int isa, int qt);
/* The portable kernels (linear_generic.c), NULL for a type they lack. */
linear_rows_fn linear_for_generic(int qt);
dequant_row_fn dequant_for_generic(int qt);

/* Highest ISA this CPU runs (ISA_*). */
int cpu_best_isa(void);

/* Activations of cpu_linear (the decode product): ACT_FLOAT32 (the default, float32
 * products) or ACT_BFLOAT16 (x and the decoded weights rounded to bfloat16, products
 * summed in float32: opt-in, on AVX-512 BF16 CPUs, when the AVX-512 kernels are in use).
 * cpu_set_activations returns -1, changing nothing, where the CPU or build lacks it. */
enum { ACT_FLOAT32 = 0, ACT_BFLOAT16 = 1 };
int cpu_bf16_supported(void);
int cpu_set_activations(int act);
int cpu_activations(int isa); /* what cpu_linear computes with at that ISA */

/* Threaded drivers (on the kernels' pool, pool.h). */
void cpu_linear(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes, int64_t N,
                int64_t K, const float *x, int64_t B, float *out, int64_t ldo);
/* One matrix of several multiplied by the same x (a layer's q, k and v; its gate and up),
 * written to out's columns col0 .. col0 + rows. */
typedef struct {
    int qt;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows;
    int64_t col0;
} linear_part;
/* cpu_linear of each part, in one hand-out to the threads (one wait for the slowest
 * rather than one per part); each output row's bits are cpu_linear's. */
void cpu_linear_parts(int isa, int nthreads, int n_parts, const linear_part *parts, int64_t K,
                      const float *x, int64_t B, float *out, int64_t ldo);
/* The row kernels cpu_linear runs for (isa, qt) with the activations in use: bf is set
 * where it runs bfloat16 products (then x goes in rounded: cpu_linear_round_x, 64 bytes
 * per 32 values of a row, into xb; it returns 0 and writes nothing for float32 ones). */
typedef struct {
    linear_rows_fn fn;
    linear_bf_rows_fn bf;
} linear_pick;
linear_pick cpu_linear_pick(int isa, int qt);
int cpu_linear_round_x(int isa, const float *x, int64_t B, int64_t K, void *xb);
void cpu_dequantize(int isa, int nthreads, int qt, const uint8_t *w, size_t row_bytes,
                    int64_t R, int64_t K, float *out);

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* IEEE half -> float, exact (subnormals, inf and NaN included). */
static inline float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    float f;
    if (exp == 0) {
        f = (float)man * 5.9604644775390625e-08f; /* man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, 4);
    return f;
}

/* fp16 -> f32 for every half (256 KiB, filled at import by f16_table_init): the product
 * kernels broadcast a block's scale straight from memory instead of converting it. */
extern float f16_table[65536];
void f16_table_init(void);

/* MXFP4's E8M0 block scale halved (its e2m1 values are stored doubled): 2^(e - 128),
 * built in the bits as gguf-py's e8m0_to_fp32_half does (subnormal for e < 2). */
static inline float e8m0_to_f32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* A K-quant super-block's scales for its chunks: Q4_K/Q5_K d * sc[j] and -(dmin * m[j])
 * per 32-value chunk j; Q6_K d * sc[i] per 16 values. */
typedef struct {
    float d[16];
    float m[8];
} kstate;

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block. */
static inline void kq_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

#endif
