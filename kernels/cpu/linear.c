/* linear (W x) and dequantize over GGUF blocks: the AVX2 and AVX-512 kernels
 * (linear_simd.h compiled once per ISA) and the ISA choice; the portable kernels are in
 * linear_generic.c, the threaded drivers in linear_run.c. Build with
 * -ffp-contract=off: every fused multiply-add here is explicit, so one ISA's arithmetic
 * is fixed by this source, not by the compiler's mood. */
#include "quants.h"

#include <stdlib.h>

const char *qt_name(int qt) {
    switch (qt) {
    case QT_F32: return "F32";
    case QT_F16: return "F16";
    case QT_Q4_0: return "Q4_0";
    case QT_Q4_1: return "Q4_1";
    case QT_Q5_0: return "Q5_0";
    case QT_Q5_1: return "Q5_1";
    case QT_Q8_0: return "Q8_0";
    case QT_Q4_K: return "Q4_K";
    case QT_Q5_K: return "Q5_K";
    case QT_Q6_K: return "Q6_K";
    case QT_BF16: return "BF16";
    case QT_MXFP4: return "MXFP4";
    default: return NULL;
    }
}

int qt_block(int qt) {
    switch (qt) {
    case QT_F32: case QT_F16: case QT_BF16: return 1;
    case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: return 256;
    default: return 32;
    }
}

int qt_tsize(int qt) {
    switch (qt) {
    case QT_F32: return 4;
    case QT_F16: case QT_BF16: return 2;
    case QT_Q4_0: return 18;
    case QT_Q4_1: return 20;
    case QT_Q5_0: return 22;
    case QT_Q5_1: return 24;
    case QT_Q8_0: return 34;
    case QT_MXFP4: return 17;
    case QT_Q4_K: return 144;
    case QT_Q5_K: return 176;
    case QT_Q6_K: return 210;
    default: return 0;
    }
}

float f16_table[65536];

void f16_table_init(void) {
    for (uint32_t h = 0; h < 65536; h++)
        f16_table[h] = fp16_to_f32((uint16_t)h);
}

/* ------------------------------------------------------------------ x86 SIMD */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PANTHEON_X86 1
#include <immintrin.h>

#if defined(__clang__)
#define TARGET_BEGIN(t) _Pragma("clang attribute push(__attribute__((target(" t "))), apply_to = function)")
#define TARGET_END _Pragma("clang attribute pop")
#endif

/* --- AVX2 + FMA + F16C: 8 lanes, 4 vectors per chunk */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#define SFX(name) name##_avx2
typedef __m256 vf_avx2;
#define vf vf_avx2
#define W 8
#define NV 4
#define BTMAX 4
#define BTMAX_SPLIT 4
#define ACCS 8
#define VZERO _mm256_setzero_ps()
#define VLOADU(p) _mm256_loadu_ps(p)
#define VSTOREU(p, v) _mm256_storeu_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VSET1(a) _mm256_set1_ps(a)
#define CVT16U(b, w)                                                                             \
    do {                                                                                         \
        (w)[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));                                    \
        (w)[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));                 \
    } while (0)
#define CVT16S(b, w)                                                                             \
    do {                                                                                         \
        (w)[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));                                    \
        (w)[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));                 \
    } while (0)
#define LDF16(p, w)                                                                              \
    do {                                                                                         \
        (w)[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)));           \
        (w)[1] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)((p) + 16)));    \
    } while (0)
#define LDBF16(p, w)                                                                             \
    do {                                                                                         \
        (w)[0] = _mm256_castsi256_ps(_mm256_slli_epi32(                                          \
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16));    \
        (w)[1] = _mm256_castsi256_ps(_mm256_slli_epi32(                                          \
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)((p) + 16))),   \
            16));                                                                                \
    } while (0)

static inline __attribute__((always_inline)) float hsum_avx2(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
#define VHSUM(v) hsum_avx2(v)
#define TILE_CASES(T)                                                                            \
    TILE_CASE(T, 1, 1) TILE_CASE(T, 1, 4) TILE_CASE(T, 2, 1) TILE_CASE(T, 2, 2)                  \
        TILE_CASE(T, 3, 1) TILE_CASE(T, 4, 1)

#include "linear_simd.h"

#undef SFX
#undef vf
#undef W
#undef NV
#undef BTMAX
#undef BTMAX_SPLIT
#undef ACCS
#undef NACC
#undef VZERO
#undef VLOADU
#undef VSTOREU
#undef VFMA
#undef VMUL
#undef VADD
#undef VSET1
#undef CVT16U
#undef CVT16S
#undef LDF16
#undef LDBF16
#undef VHSUM
#undef TILE_CASES
#undef TILE_CASE
#undef DEF_TYPE
#undef TILE_SUMS
#undef TILE_STEP_PREP
#undef TILE_STORE
#undef AI
#undef LD128
#undef H2F
#undef T2F

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

/* --- AVX-512 F+BW+VL + FMA + F16C: 16 lanes, 2 vectors per chunk */
/* Compilers that know AVX-512 BF16 also build the opt-in bfloat16 product (BF16DOT);
 * its functions run only where the CPU has it (cpu_bf16_supported). */
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define BF16DOT 1
#endif
#if defined(__clang__) && defined(BF16DOT)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"))), apply_to = function)
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#elif defined(BF16DOT)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#define SFX(name) name##_avx512
/* 4- and 5-bit quants: the chunk's 16 (32) possible values computed once, then looked up
 * by permutes (vpermps / vpermt2ps use only the index's low 4 / 5 bits). */
#define PERM16 1
#define IOTA16 _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, 15.f)
typedef __m512 vf_avx512;
#define vf vf_avx512
#define W 16
#define NV 2
#define BTMAX 8
#define BTMAX_SPLIT 4
#define ACCS 16
#define NACC 1
#define VZERO _mm512_setzero_ps()
#define VLOADU(p) _mm512_loadu_ps(p)
#define VSTOREU(p, v) _mm512_storeu_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSET1(a) _mm512_set1_ps(a)
#define CVT16U(b, w) ((w)[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)))
#define CVT16S(b, w) ((w)[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)))
#define LDF16(p, w)                                                                              \
    ((w)[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p))))
#define LDBF16(p, w)                                                                             \
    ((w)[0] = _mm512_castsi512_ps(_mm512_slli_epi32(                                             \
         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16)))

static inline __attribute__((always_inline)) float hsum_avx512(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}
#define VHSUM(v) hsum_avx512(v)
#define TILE_CASES(T)                                                                            \
    TILE_CASE(T, 1, 1) TILE_CASE(T, 1, 4) TILE_CASE(T, 2, 1) TILE_CASE(T, 2, 4)                  \
        TILE_CASE(T, 3, 1) TILE_CASE(T, 3, 4) TILE_CASE(T, 4, 1) TILE_CASE(T, 4, 4)              \
            TILE_CASE(T, 5, 1) TILE_CASE(T, 5, 2) TILE_CASE(T, 6, 1) TILE_CASE(T, 6, 2)          \
                TILE_CASE(T, 7, 1) TILE_CASE(T, 7, 2) TILE_CASE(T, 8, 1) TILE_CASE(T, 8, 2)

#include "linear_simd.h"

#undef SFX
#undef vf
#undef W
#undef NV
#undef BTMAX
#undef BTMAX_SPLIT
#undef ACCS
#undef NACC
#undef VZERO
#undef VLOADU
#undef VSTOREU
#undef VFMA
#undef VMUL
#undef VADD
#undef VSET1
#undef CVT16U
#undef CVT16S
#undef LDF16
#undef LDBF16
#undef VHSUM
#undef TILE_CASES
#undef TILE_CASE
#undef DEF_TYPE
#undef TILE_SUMS
#undef TILE_STEP_PREP
#undef TILE_STORE
#undef AI
#undef LD128
#undef H2F
#undef T2F
#undef PERM16
#undef IOTA16

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* x86 */

/* ------------------------------------------------------------------ dispatch */

static int g_activations = ACT_FLOAT32;

int cpu_bf16_supported(void) {
#if defined(PANTHEON_X86) && defined(BF16DOT)
    __builtin_cpu_init();
    return cpu_best_isa() == ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

int cpu_set_activations(int act) {
    if (act == ACT_BFLOAT16 && !cpu_bf16_supported())
        return -1;
    if (act != ACT_FLOAT32 && act != ACT_BFLOAT16)
        return -1;
    g_activations = act;
    return 0;
}

int cpu_activations(int isa) {
    return g_activations == ACT_BFLOAT16 && isa == ISA_AVX512 ? ACT_BFLOAT16 : ACT_FLOAT32;
}

int cpu_best_isa(void) {
#ifdef PANTHEON_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("avx2"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return ISA_AVX2; /* F16C comes with every AVX2 CPU */
#endif
    return ISA_GENERIC;
}

/* A type without a SIMD kernel at an ISA runs the portable one. */
linear_rows_fn linear_kernel(int isa, int qt) {
    linear_rows_fn fn = NULL;
#ifdef PANTHEON_X86
    if (isa == ISA_AVX512)
        fn = linear_for_avx512(qt);
    if (isa == ISA_AVX2)
        fn = linear_for_avx2(qt);
#endif
    (void)isa;
    return fn != NULL ? fn : linear_for_generic(qt);
}

dequant_row_fn dequant_kernel(int isa, int qt) {
    dequant_row_fn fn = NULL;
#ifdef PANTHEON_X86
    if (isa == ISA_AVX512)
        fn = dequant_for_avx512(qt);
    if (isa == ISA_AVX2)
        fn = dequant_for_avx2(qt);
#endif
    (void)isa;
    return fn != NULL ? fn : dequant_for_generic(qt);
}

/* See quants.h: the row kernels cpu_linear would pick, for drivers that hand out rows
 * themselves (mixture.c), and the bfloat16 rounding of x it does first. */
linear_pick cpu_linear_pick(int isa, int qt) {
    linear_pick p = {linear_kernel(isa, qt), NULL};
#if defined(PANTHEON_X86) && defined(BF16DOT)
    if (cpu_activations(isa) == ACT_BFLOAT16)
        p.bf = linear_bf_for_avx512(qt);
#endif
    return p;
}

int cpu_linear_round_x(int isa, const float *x, int64_t B, int64_t K, void *xb) {
#if defined(PANTHEON_X86) && defined(BF16DOT)
    if (cpu_activations(isa) == ACT_BFLOAT16) {
        if (K / 32 > 0)
            x_to_bf16_avx512(x, B, K, xb);
        return 1;
    }
#endif
    (void)isa, (void)x, (void)B, (void)K, (void)xb;
    return 0;
}
