/* SIMD body of the linear and dequantize kernels, included once per x86 ISA by linear.c
 * inside a `#pragma GCC target` region, with these macros defined:
 *   SFX(name)       name suffixed with the ISA
 *   vf, W, NV       float vector type, its lanes, vectors per 32 values (NV = 32 / W)
 *   BTMAX, ACCS     x-rows per tile, vector accumulators the tile may keep in registers
 *   VZERO VLOADU VSTOREU VFMA VMUL VADD VSET1 VHSUM
 *   CVT16U(b, w) / CVT16S(b, w)   16 unsigned / signed bytes (__m128i) -> w[0 .. NV/2)
 *   LDF16(p, w) / LDBF16(p, w)    16 halves / bfloat16 at p -> w[0 .. NV/2)
 *
 * A "chunk" is 32 consecutive values of a weight row. Every decoder writes the chunk's
 * values into w[0 .. NV): exact = 1 computes them as gguf-py does (q * d, then + m);
 * exact = 0 (the product) fuses them into one FMA per vector. */

#define AI static inline __attribute__((always_inline))
#ifndef PF_GROUPS
#define PF_GROUPS 2
#endif

AI void SFX(affine)(vf *w, float d0, float d1, float m0, float m1, int has_m, int exact) {
    const vf vd0 = VSET1(d0), vd1 = VSET1(d1), vm0 = VSET1(m0), vm1 = VSET1(m1);
    for (int v = 0; v < NV; v++) {
        const vf d = v < NV / 2 ? vd0 : vd1, m = v < NV / 2 ? vm0 : vm1;
        if (!has_m)
            w[v] = VMUL(w[v], d);
        else if (exact)
            w[v] = VADD(VMUL(w[v], d), m);
        else
            w[v] = VFMA(w[v], d, m);
    }
}

/* 16 bits of m -> 16 bytes, 0x10 where the bit is set (the fifth bit of a Q5 quant). */
AI __m128i SFX(bits16)(uint32_t m) {
    const __m128i shuf = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    __m128i v = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)(m & 0xffffu)), shuf);
    v = _mm_cmpeq_epi8(_mm_and_si128(v, bit), bit);
    return _mm_and_si128(v, _mm_set1_epi8(0x10));
}

#define LD128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))
#define H2F(p) _cvtsh_ss(rd16(p))
#define T2F(p) f16_table[rd16(p)]

AI void SFX(chunk_q4_0)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *b = row + c * 18;
#ifdef PERM16
    if (!exact) {
        const __m512i v = _mm512_cvtepu8_epi32(LD128(b + 2));
        const __m512 t = _mm512_mul_ps(_mm512_sub_ps(IOTA16, VSET1(8.f)), VSET1(T2F(b)));
        w[0] = _mm512_permutexvar_ps(v, t);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t);
        return;
    }
#endif
    const __m128i q = LD128(b + 2), m4 = _mm_set1_epi8(0x0f), k8 = _mm_set1_epi8(8);
    CVT16S(_mm_sub_epi8(_mm_and_si128(q, m4), k8), w);
    CVT16S(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), k8), w + NV / 2);
    const float d = H2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_q4_1)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *b = row + c * 20;
#ifdef PERM16
    if (!exact) {
        const __m512i v = _mm512_cvtepu8_epi32(LD128(b + 4));
        const __m512 t = _mm512_fmadd_ps(IOTA16, VSET1(T2F(b)), VSET1(T2F(b + 2)));
        w[0] = _mm512_permutexvar_ps(v, t);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t);
        return;
    }
#endif
    const __m128i q = LD128(b + 4), m4 = _mm_set1_epi8(0x0f);
    CVT16U(_mm_and_si128(q, m4), w);
    CVT16U(_mm_and_si128(_mm_srli_epi16(q, 4), m4), w + NV / 2);
    const float d = H2F(b), m = H2F(b + 2);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q5_0)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *b = row + c * 22;
    const uint32_t qh = rd32(b + 2);
#ifdef PERM16
    if (!exact) {
        const __m512i v = _mm512_cvtepu8_epi32(LD128(b + 6)), k16 = _mm512_set1_epi32(16);
        const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(15));
        const __m512i hi = _mm512_srli_epi32(v, 4);
        const __m512 d = VSET1(T2F(b));
        const __m512 t0 = _mm512_mul_ps(_mm512_sub_ps(IOTA16, VSET1(16.f)), d);
        const __m512 t1 = _mm512_mul_ps(IOTA16, d);
        w[0] = _mm512_permutex2var_ps(t0, _mm512_mask_or_epi32(lo, (__mmask16)qh, lo, k16), t1);
        w[1] = _mm512_permutex2var_ps(t0, _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, k16), t1);
        return;
    }
#endif
    const __m128i q = LD128(b + 6), m4 = _mm_set1_epi8(0x0f), k16 = _mm_set1_epi8(16);
    const __m128i lo = _mm_or_si128(_mm_and_si128(q, m4), SFX(bits16)(qh));
    const __m128i hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), m4), SFX(bits16)(qh >> 16));
    CVT16S(_mm_sub_epi8(lo, k16), w);
    CVT16S(_mm_sub_epi8(hi, k16), w + NV / 2);
    const float d = H2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_q5_1)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *b = row + c * 24;
    const uint32_t qh = rd32(b + 4);
#ifdef PERM16
    if (!exact) {
        const __m512i v = _mm512_cvtepu8_epi32(LD128(b + 8)), k16 = _mm512_set1_epi32(16);
        const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(15));
        const __m512i hi = _mm512_srli_epi32(v, 4);
        const __m512 d = VSET1(T2F(b)), m = VSET1(T2F(b + 2));
        const __m512 t0 = _mm512_fmadd_ps(IOTA16, d, m);
        const __m512 t1 = _mm512_fmadd_ps(_mm512_add_ps(IOTA16, VSET1(16.f)), d, m);
        w[0] = _mm512_permutex2var_ps(t0, _mm512_mask_or_epi32(lo, (__mmask16)qh, lo, k16), t1);
        w[1] = _mm512_permutex2var_ps(t0, _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, k16), t1);
        return;
    }
#endif
    const __m128i q = LD128(b + 8), m4 = _mm_set1_epi8(0x0f);
    CVT16U(_mm_or_si128(_mm_and_si128(q, m4), SFX(bits16)(qh)), w);
    CVT16U(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), m4), SFX(bits16)(qh >> 16)),
           w + NV / 2);
    const float d = H2F(b), m = H2F(b + 2);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q8_0)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *b = row + c * 34;
    CVT16S(LD128(b + 2), w);
    CVT16S(LD128(b + 18), w + NV / 2);
    const float d = H2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_q4_k)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *sb = row + (c >> 3) * 144;
    const int j = (int)(c & 7);
    const uint8_t *qs = sb + 16 + 32 * (j >> 1);
#ifdef PERM16
    if (!exact) {
        int sc, mn;
        kq_scale_min(sb + 4, j, &sc, &mn);
        const __m512 t = _mm512_fmadd_ps(IOTA16, VSET1(T2F(sb) * (float)sc),
                                         VSET1(-(T2F(sb + 2) * (float)mn)));
        const __m128i sh = _mm_cvtsi32_si128(4 * (j & 1));
        w[0] = _mm512_permutexvar_ps(_mm512_srl_epi32(_mm512_cvtepu8_epi32(LD128(qs)), sh), t);
        w[1] = _mm512_permutexvar_ps(_mm512_srl_epi32(_mm512_cvtepu8_epi32(LD128(qs + 16)), sh), t);
        return;
    }
#endif
    const __m128i sh = _mm_cvtsi32_si128(4 * (j & 1)), m4 = _mm_set1_epi8(0x0f);
    CVT16U(_mm_and_si128(_mm_srl_epi16(LD128(qs), sh), m4), w);
    CVT16U(_mm_and_si128(_mm_srl_epi16(LD128(qs + 16), sh), m4), w + NV / 2);
    int sc, mn;
    kq_scale_min(sb + 4, j, &sc, &mn);
    const float d = H2F(sb) * (float)sc, m = -(H2F(sb + 2) * (float)mn);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q5_k)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *sb = row + (c >> 3) * 176;
    const int j = (int)(c & 7);
    const uint8_t *qh = sb + 16, *qs = sb + 48 + 32 * (j >> 1);
    const __m128i sh = _mm_cvtsi32_si128(4 * (j & 1)), shh = _mm_cvtsi32_si128(j);
    const __m128i m4 = _mm_set1_epi8(0x0f), one = _mm_set1_epi8(1);
    for (int h = 0; h < 2; h++) {
        const __m128i lo = _mm_and_si128(_mm_srl_epi16(LD128(qs + 16 * h), sh), m4);
        const __m128i hb = _mm_and_si128(_mm_srl_epi16(LD128(qh + 16 * h), shh), one);
        CVT16U(_mm_or_si128(lo, _mm_slli_epi16(hb, 4)), w + h * (NV / 2));
    }
    int sc, mn;
    kq_scale_min(sb + 4, j, &sc, &mn);
    const float d = H2F(sb) * (float)sc, m = -(H2F(sb + 2) * (float)mn);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q6_k)(const uint8_t *row, int64_t c, vf *w, int exact) {
    const uint8_t *sb = row + (c >> 3) * 210;
    const int j = (int)(c & 7), g = j >> 2, s = j & 3;
    const uint8_t *ql = sb + 64 * g + 32 * (s & 1), *qh = sb + 128 + 32 * g;
    const __m128i shl = _mm_cvtsi32_si128(4 * (s >> 1)), shh = _mm_cvtsi32_si128(2 * s);
    const __m128i m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(3), k32 = _mm_set1_epi8(32);
    for (int h = 0; h < 2; h++) {
        const __m128i lo = _mm_and_si128(_mm_srl_epi16(LD128(ql + 16 * h), shl), m4);
        const __m128i hb = _mm_and_si128(_mm_srl_epi16(LD128(qh + 16 * h), shh), m2);
        CVT16S(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hb, 4)), k32), w + h * (NV / 2));
    }
    const int8_t *sc = (const int8_t *)(sb + 192);
    const float d = H2F(sb + 208);
    SFX(affine)(w, d * (float)sc[2 * j], d * (float)sc[2 * j + 1], 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_f32)(const uint8_t *row, int64_t c, vf *w, int exact) {
    (void)exact;
    const float *p = (const float *)(const void *)row + c * 32;
    for (int v = 0; v < NV; v++)
        w[v] = VLOADU(p + v * W);
}

AI void SFX(chunk_f16)(const uint8_t *row, int64_t c, vf *w, int exact) {
    (void)exact;
    const uint8_t *p = row + c * 64;
    LDF16(p, w);
    LDF16(p + 32, w + NV / 2);
}

AI void SFX(chunk_bf16)(const uint8_t *row, int64_t c, vf *w, int exact) {
    (void)exact;
    const uint8_t *p = row + c * 64;
    LDBF16(p, w);
    LDBF16(p + 32, w + NV / 2);
}

/* Scalar value k of a float-typed row (the K % 32 tail; quantised rows have none). */
AI float SFX(val_f32)(const uint8_t *row, int64_t k) {
    float f;
    memcpy(&f, row + 4 * k, 4);
    return f;
}
AI float SFX(val_f16)(const uint8_t *row, int64_t k) { return fp16_to_f32(rd16(row + 2 * k)); }
AI float SFX(val_bf16)(const uint8_t *row, int64_t k) { return bf16_to_f32(rd16(row + 2 * k)); }
AI float SFX(val_none)(const uint8_t *row, int64_t k) {
    (void)row;
    (void)k;
    return 0.f;
}

/* The tile: R weight rows times BT x-rows, both compile-time constants once inlined.
 * Every (r, b) keeps its own two accumulators; vector v of every chunk goes into
 * accumulator v % 2, chunks in order, then one fixed horizontal sum, then the tail in
 * order. Nothing in (r, b)'s arithmetic depends on R, BT, the other rows or r0. */
#define DEF_TYPE(T, TAILED, VAL)                                                                  \
    AI void SFX(tile_##T)(const uint8_t *w, size_t rb, const int R, const int BT,                \
                          const float *x, int64_t K, float *out, int64_t ldo) {                  \
        const int64_t nch = K / 32;                                                              \
        vf acc[4][8][2];                                                                         \
        for (int r = 0; r < R; r++)                                                              \
            for (int b = 0; b < BT; b++)                                                         \
                acc[r][b][0] = acc[r][b][1] = VZERO;                                             \
        /* Software prefetch PF_GROUPS row groups ahead: the rows are one contiguous      \
         * stream read at R points at once, which the hardware prefetchers follow poorly. */ \
        const size_t cb = rb * 32 / (size_t)K, step = (size_t)R * cb;                            \
        const uint8_t *pf = w + (size_t)PF_GROUPS * R * rb;                                      \
        for (int64_t c = 0; c < nch; c++) {                                                      \
            for (size_t off = 0; off < step; off += 64)                                          \
                _mm_prefetch((const char *)(pf + (size_t)c * step + off), _MM_HINT_T0);          \
            for (int r = 0; r < R; r++) {                                                        \
                vf wv[NV];                                                                       \
                SFX(chunk_##T)(w + r * rb, c, wv, 0);                                            \
                for (int b = 0; b < BT; b++) {                                                   \
                    const float *xp = x + b * K + c * 32;                                        \
                    for (int v = 0; v < NV; v++)                                                 \
                        acc[r][b][v & 1] = VFMA(wv[v], VLOADU(xp + v * W), acc[r][b][v & 1]);    \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < R; r++)                                                              \
            for (int b = 0; b < BT; b++) {                                                       \
                float s = VHSUM(VADD(acc[r][b][0], acc[r][b][1]));                               \
                if (TAILED)                                                                      \
                    for (int64_t k = nch * 32; k < K; k++)                                       \
                        s += SFX(val_##VAL)(w + r * rb, k) * x[b * K + k];                       \
                out[b * ldo + r] = s;                                                            \
            }                                                                                    \
    }                                                                                            \
    static void SFX(tiles_##T)(const uint8_t *w, size_t rb, int R, int BT, const float *x,       \
                               int64_t K, float *out, int64_t ldo) {                             \
        switch (BT * 8 + R) {                                                                    \
            TILE_CASES(T)                                                                        \
        default:                                                                                 \
            break;                                                                               \
        }                                                                                        \
    }                                                                                            \
    static void SFX(rows_##T)(const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t K,    \
                              const float *x, int64_t B, float *out, int64_t ldo) {             \
        for (int64_t g = r0; g < r1; g += 4) {                                                   \
            const int64_t ge = g + 4 < r1 ? g + 4 : r1;                                          \
            for (int64_t b0 = 0; b0 < B; b0 += BTMAX) {                                          \
                const int bt = (int)(B - b0 < BTMAX ? B - b0 : BTMAX);                           \
                int R = ACCS / (2 * bt);                                                         \
                R = R >= 4 ? 4 : R >= 2 ? 2 : 1;                                                 \
                int64_t r = g;                                                                   \
                for (; r + R <= ge; r += R)                                                      \
                    SFX(tiles_##T)(w + r * rb, rb, R, bt, x + b0 * K, K, out + b0 * ldo + r,     \
                                   ldo);                                                         \
                for (; r < ge; r++)                                                              \
                    SFX(tiles_##T)(w + r * rb, rb, 1, bt, x + b0 * K, K, out + b0 * ldo + r,     \
                                   ldo);                                                         \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    static void SFX(deq_##T)(const uint8_t *row, int64_t K, float *out) {                        \
        const int64_t nch = K / 32;                                                              \
        for (int64_t c = 0; c < nch; c++) {                                                      \
            vf wv[NV];                                                                           \
            SFX(chunk_##T)(row, c, wv, 1);                                                       \
            for (int v = 0; v < NV; v++)                                                         \
                VSTOREU(out + c * 32 + v * W, wv[v]);                                            \
        }                                                                                        \
        if (TAILED)                                                                              \
            for (int64_t k = nch * 32; k < K; k++)                                               \
                out[k] = SFX(val_##VAL)(row, k);                                                 \
    }

#define TILE_CASE(T, BT, R)                                                                      \
    case BT * 8 + R:                                                                             \
        SFX(tile_##T)(w, rb, R, BT, x, K, out, ldo);                                             \
        break;

DEF_TYPE(q4_0, 0, none)
DEF_TYPE(q4_1, 0, none)
DEF_TYPE(q5_0, 0, none)
DEF_TYPE(q5_1, 0, none)
DEF_TYPE(q8_0, 0, none)
DEF_TYPE(q4_k, 0, none)
DEF_TYPE(q5_k, 0, none)
DEF_TYPE(q6_k, 0, none)
DEF_TYPE(f32, 1, f32)
DEF_TYPE(f16, 1, f16)
DEF_TYPE(bf16, 1, bf16)

static linear_rows_fn SFX(linear_for)(int qt) {
    switch (qt) {
    case QT_F32: return SFX(rows_f32);
    case QT_F16: return SFX(rows_f16);
    case QT_BF16: return SFX(rows_bf16);
    case QT_Q4_0: return SFX(rows_q4_0);
    case QT_Q4_1: return SFX(rows_q4_1);
    case QT_Q5_0: return SFX(rows_q5_0);
    case QT_Q5_1: return SFX(rows_q5_1);
    case QT_Q8_0: return SFX(rows_q8_0);
    case QT_Q4_K: return SFX(rows_q4_k);
    case QT_Q5_K: return SFX(rows_q5_k);
    case QT_Q6_K: return SFX(rows_q6_k);
    default: return NULL;
    }
}

static dequant_row_fn SFX(dequant_for)(int qt) {
    switch (qt) {
    case QT_F32: return SFX(deq_f32);
    case QT_F16: return SFX(deq_f16);
    case QT_BF16: return SFX(deq_bf16);
    case QT_Q4_0: return SFX(deq_q4_0);
    case QT_Q4_1: return SFX(deq_q4_1);
    case QT_Q5_0: return SFX(deq_q5_0);
    case QT_Q5_1: return SFX(deq_q5_1);
    case QT_Q8_0: return SFX(deq_q8_0);
    case QT_Q4_K: return SFX(deq_q4_k);
    case QT_Q5_K: return SFX(deq_q5_k);
    case QT_Q6_K: return SFX(deq_q6_k);
    default: return NULL;
    }
}
