/* SIMD body of the linear and dequantize kernels, included once per x86 ISA by linear.c
 * inside a `#pragma GCC target` region, with these macros defined:
 *   SFX(name)       name suffixed with the ISA
 *   vf, W, NV       float vector type, its lanes, vectors per 32 values (NV = 32 / W)
 *   BTMAX, ACCS     x-rows per tile, vector accumulators the tile may keep in registers
 *   BTMAX_SPLIT     x-rows per tile while 2 * BTMAX_SPLIT or more are left (x_block)
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

AI void SFX(chunk_q4_0)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
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
    const float d = T2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

/* MXFP4: 16 e2m1 codes (low nibbles, then high), doubled, times the halved E8M0 scale:
 * exact products, so the fused and the exact decodes are the same values. */
AI void SFX(chunk_mxfp4)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                       const int u) {
    (void)st;
    (void)u;
    const uint8_t *b = row + c * 17;
    const float d = e8m0_to_f32_half(b[0]);
#ifdef PERM16
    const __m512 kv = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f, 0.f, -1.f, -2.f,
                                     -3.f, -4.f, -6.f, -8.f, -12.f);
    const __m512i v = _mm512_cvtepu8_epi32(LD128(b + 1));
    const __m512 t = _mm512_mul_ps(kv, VSET1(d));
    w[0] = _mm512_permutexvar_ps(v, t);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t);
    (void)exact;
#else
    const __m128i kv = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i q = LD128(b + 1), m4 = _mm_set1_epi8(0x0f);
    CVT16S(_mm_shuffle_epi8(kv, _mm_and_si128(q, m4)), w);
    CVT16S(_mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4)), w + NV / 2);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
#endif
}

AI void SFX(chunk_q4_1)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
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
    const float d = T2F(b), m = T2F(b + 2);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q5_0)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
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
    const float d = T2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_q5_1)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
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
    const float d = T2F(b), m = T2F(b + 2);
    SFX(affine)(w, d, d, m, m, 1, exact);
}

AI void SFX(chunk_q8_0)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
    const uint8_t *b = row + c * 34;
    CVT16S(LD128(b + 2), w);
    CVT16S(LD128(b + 18), w + NV / 2);
    const float d = T2F(b);
    SFX(affine)(w, d, d, 0.f, 0.f, 0, exact);
}

AI void SFX(chunk_q4_k)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    /* u: c % 2 when the caller knows it at compile time (-1: not known) */
    const uint8_t *sb = row + (c >> 3) * 144;
    const int j = (int)(c & 7), odd = u >= 0 ? (u & 1) : (j & 1);
    const uint8_t *qs = sb + 16 + 32 * (j >> 1);
#ifdef PERM16
    if (!exact) {
        const __m512 t = _mm512_fmadd_ps(IOTA16, VSET1(st->d[j]), VSET1(st->m[j]));
        const __m512i v0 = _mm512_cvtepu8_epi32(LD128(qs)), v1 = _mm512_cvtepu8_epi32(LD128(qs + 16));
        w[0] = _mm512_permutexvar_ps(odd ? _mm512_srli_epi32(v0, 4) : v0, t);
        w[1] = _mm512_permutexvar_ps(odd ? _mm512_srli_epi32(v1, 4) : v1, t);
        return;
    }
#endif
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i q0 = LD128(qs), q1 = LD128(qs + 16);
    CVT16U(_mm_and_si128(odd ? _mm_srli_epi16(q0, 4) : q0, m4), w);
    CVT16U(_mm_and_si128(odd ? _mm_srli_epi16(q1, 4) : q1, m4), w + NV / 2);
    SFX(affine)(w, st->d[j], st->d[j], st->m[j], st->m[j], 1, exact);
}

AI void SFX(chunk_q5_k)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    const uint8_t *sb = row + (c >> 3) * 176;
    const int j = (int)(c & 7), odd = u >= 0 ? (u & 1) : (j & 1);
    const uint8_t *qh = sb + 16, *qs = sb + 48 + 32 * (j >> 1);
#ifdef PERM16
    if (!exact) {
        const __m512 d = VSET1(st->d[j]), m = VSET1(st->m[j]);
        const __m512 t0 = _mm512_fmadd_ps(IOTA16, d, m);
        const __m512 t1 = _mm512_fmadd_ps(_mm512_add_ps(IOTA16, VSET1(16.f)), d, m);
        const __m128i bit = _mm_set1_epi8((char)(1 << j));
        const __m512i k16 = _mm512_set1_epi32(16);
        for (int h = 0; h < 2; h++) {
            const __m512i v = _mm512_cvtepu8_epi32(LD128(qs + 16 * h));
            const __m512i lo = _mm512_and_si512(odd ? _mm512_srli_epi32(v, 4) : v, _mm512_set1_epi32(15));
            const __mmask16 hb = _mm_test_epi8_mask(LD128(qh + 16 * h), bit);
            w[h] = _mm512_permutex2var_ps(t0, _mm512_mask_or_epi32(lo, hb, lo, k16), t1);
        }
        return;
    }
#endif
    const __m128i shh = _mm_cvtsi32_si128(j);
    const __m128i m4 = _mm_set1_epi8(0x0f), one = _mm_set1_epi8(1);
    for (int h = 0; h < 2; h++) {
        const __m128i q = LD128(qs + 16 * h);
        const __m128i lo = _mm_and_si128(odd ? _mm_srli_epi16(q, 4) : q, m4);
        const __m128i hb = _mm_and_si128(_mm_srl_epi16(LD128(qh + 16 * h), shh), one);
        CVT16U(_mm_or_si128(lo, _mm_slli_epi16(hb, 4)), w + h * (NV / 2));
    }
    SFX(affine)(w, st->d[j], st->d[j], st->m[j], st->m[j], 1, exact);
}

AI void SFX(chunk_q6_k)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    /* u: c % 4 when the caller knows it at compile time (-1: not known) */
    const uint8_t *sb = row + (c >> 3) * 210;
    const int j = (int)(c & 7), g = j >> 2, s = u >= 0 ? u : (j & 3);
    const uint8_t *ql = sb + 64 * g + 32 * (s & 1), *qh = sb + 128 + 32 * g;
    const __m128i m4 = _mm_set1_epi8(0x0f), m30 = _mm_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m128i l = LD128(ql + 16 * h), hq = LD128(qh + 16 * h);
        __m128i lo, hb; /* low 4 bits; bits 2s, 2s+1 of qh moved to bits 4, 5 */
        if (u >= 0) {   /* s known at compile time: immediate shifts */
            lo = _mm_and_si128(s >> 1 ? _mm_srli_epi16(l, 4) : l, m4);
            hb = _mm_and_si128(s == 0   ? _mm_slli_epi16(hq, 4)
                               : s == 1 ? _mm_slli_epi16(hq, 2)
                               : s == 2 ? hq
                                        : _mm_srli_epi16(hq, 2),
                               m30);
        } else {
            lo = _mm_and_si128(_mm_srl_epi16(l, _mm_cvtsi32_si128(4 * (s >> 1))), m4);
            hb = _mm_slli_epi16(
                _mm_and_si128(_mm_srl_epi16(hq, _mm_cvtsi32_si128(2 * s)), _mm_set1_epi8(3)), 4);
        }
        const __m128i q = _mm_or_si128(lo, hb); /* 0..63 */
        if (exact)
            CVT16S(_mm_sub_epi8(q, _mm_set1_epi8(32)), w + h * (NV / 2));
        else
            CVT16U(q, w + h * (NV / 2));
    }
    const float d0 = st->d[2 * j], d1 = st->d[2 * j + 1];
    if (exact) /* gguf: (d * sc) * (q - 32) */
        SFX(affine)(w, d0, d1, 0.f, 0.f, 0, 1);
    else /* (d * sc) * q - 32 * (d * sc), one FMA */
        SFX(affine)(w, d0, d1, -32.f * d0, -32.f * d1, 1, 0);
}

AI void SFX(chunk_f32)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
    (void)exact;
    const float *p = (const float *)(const void *)row + c * 32;
    for (int v = 0; v < NV; v++)
        w[v] = VLOADU(p + v * W);
}

AI void SFX(chunk_f16)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
    (void)exact;
    const uint8_t *p = row + c * 64;
    LDF16(p, w);
    LDF16(p + 32, w + NV / 2);
}

AI void SFX(chunk_bf16)(const uint8_t *row, int64_t c, vf *w, int exact, const kstate *st,
                      const int u) {
    (void)st;
    (void)u;
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

/* Per (row, super-block) scales, computed once for its 8 chunks (K-quants), 8 or 16 at a
 * time: the same float products (d * sc, dmin * m) as the scalar unpacking. */
AI void SFX(kq_scales)(const uint8_t *sb, kstate *st) {
    const uint32_t a = rd32(sb + 4), b = rd32(sb + 8), c = rd32(sb + 12);
    const uint64_t sc = (uint64_t)(a & 0x3f3f3f3fu) |
                        (uint64_t)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)) << 32;
    const uint64_t mn = (uint64_t)(b & 0x3f3f3f3fu) |
                        (uint64_t)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)) << 32;
    const __m256 d = _mm256_set1_ps(T2F(sb)), dmin = _mm256_set1_ps(T2F(sb + 2));
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(st->d, _mm256_mul_ps(d, scf));
    /* -(dmin * m): negating is exact, as in the scalar form */
    _mm256_storeu_ps(st->m, _mm256_xor_ps(_mm256_mul_ps(dmin, mnf), _mm256_set1_ps(-0.0f)));
}
AI void SFX(prep_q4_k)(const uint8_t *row, int64_t sbi, kstate *st) {
    SFX(kq_scales)(row + sbi * 144, st);
}
AI void SFX(prep_q5_k)(const uint8_t *row, int64_t sbi, kstate *st) {
    SFX(kq_scales)(row + sbi * 176, st);
}
AI void SFX(prep_q6_k)(const uint8_t *row, int64_t sbi, kstate *st) {
    const uint8_t *sb = row + sbi * 210;
    const __m256 d = _mm256_set1_ps(T2F(sb + 208));
    const __m128i sc = LD128(sb + 192);
    _mm256_storeu_ps(st->d, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(st->d + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                     _mm_srli_si128(sc, 8)))));
}
AI void SFX(prep_none)(const uint8_t *row, int64_t sbi, kstate *st) {
    (void)row;
    (void)sbi;
    (void)st;
}

/* The horizontal sums of a tile's accumulators: sums[r][b] = VHSUM(ACC), ACC an expression
 * of r and b. AVX-512 sums a full tile (R x BT = 16) as one transposed tree instead of 16
 * separate reductions (~45 shuffles and adds instead of ~140; on a 576-wide product the
 * reductions were a tenth of the tile): every lane is paired exactly as hsum_avx512 pairs
 * it (i + i+8, then i + i+4, i + i+2, i + i+1), so the bits are the same. */
#ifdef PERM16
AI void SFX(hsum16)(const __m512 *v, float *out) {
    __m512 t[8], u[4], w[2];
    for (int j = 0; j < 8; j++) /* lanes 0-7: v[2j]'s lo256 + hi256; 8-15: v[2j + 1]'s */
        t[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * j], v[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int m = 0; m < 4; m++) /* 128-bit lane q: v[4m + q]'s lo128 + hi128 */
        u[m] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(t[2 * m], t[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int n = 0; n < 2; n++) /* lane k: v[8n + k]'s (0 + 2, 1 + 3), v[8n + 4 + k]'s */
        w[n] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * n], u[2 * n + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * n], u[2 * n + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4k + j: v[4j + k]'s last pair */
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    for (int i = 0; i < 16; i++)
        out[i] = lanes[4 * (i & 3) + (i >> 2)];
}
#define TILE_SUMS(R, BT, ACC, sums)                                                              \
    do {                                                                                         \
        if ((R) * (BT) == 16) {                                                                  \
            __m512 v16[16];                                                                      \
            float s16[16];                                                                       \
            for (int r = 0; r < (R); r++)                                                        \
                for (int b = 0; b < (BT); b++)                                                   \
                    v16[r * (BT) + b] = (ACC);                                                   \
            SFX(hsum16)(v16, s16);                                                               \
            for (int r = 0; r < (R); r++)                                                        \
                for (int b = 0; b < (BT); b++)                                                   \
                    (sums)[r][b] = s16[r * (BT) + b];                                            \
        } else {                                                                                 \
            for (int r = 0; r < (R); r++)                                                        \
                for (int b = 0; b < (BT); b++)                                                   \
                    (sums)[r][b] = VHSUM(ACC);                                                   \
        }                                                                                        \
    } while (0)
#else
#define TILE_SUMS(R, BT, ACC, sums)                                                              \
    do {                                                                                         \
        for (int r = 0; r < (R); r++)                                                            \
            for (int b = 0; b < (BT); b++)                                                       \
                (sums)[r][b] = VHSUM(ACC);                                                       \
    } while (0)
#endif

/* A tile's shared steps (the float and the bfloat16 tiles): before chunks c0 .. c0 + CS,
 * software prefetch PF_GROUPS row groups ahead (the rows are one contiguous stream read
 * at R points at once, which the hardware prefetchers follow poorly) and, at a K-quant
 * super-block, its per-row scales; after the chunks, the float tail of F32/F16/BF16 rows
 * and the stores. Both read the tile's w, rb, R, BT, K, nch, x, out, ldo, st. */
#define TILE_STEP_PREP(P, SB, CS)                                                                \
    do {                                                                                         \
        const size_t step_ = (size_t)R * (rb * 32 / (size_t)K);                                  \
        const uint8_t *pf_ = w + (size_t)PF_GROUPS * R * rb + (size_t)c0 * step_;                \
        for (size_t off = 0; off < (CS) * step_; off += 64)                                      \
            _mm_prefetch((const char *)(pf_ + off), _MM_HINT_T0);                                \
        if ((SB) > 1 && c0 % (SB) == 0)                                                          \
            for (int r = 0; r < R; r++)                                                          \
                SFX(prep_##P)(w + r * rb, c0 / (SB), &st[r]);                                    \
    } while (0)
#define TILE_STORE(TAILED, VAL, sums)                                                            \
    for (int r = 0; r < R; r++)                                                                  \
        for (int b = 0; b < BT; b++) {                                                           \
            float s = (sums)[r][b];                                                              \
            if (TAILED)                                                                          \
                for (int64_t k = nch * 32; k < K; k++)                                           \
                    s += SFX(val_##VAL)(w + r * rb, k) * x[b * K + k];                           \
            out[b * ldo + r] = s;                                                                \
        }

/* The tile: R weight rows times BT x-rows, both compile-time constants once inlined.
 * Every (r, b) keeps its own NACC accumulators; vector v of every chunk goes into
 * accumulator v % NACC, chunks in order, then one fixed horizontal sum, then the tail in
 * order. Nothing in (r, b)'s arithmetic depends on R, BT, the other rows or r0.
 * NACC = 1 (AVX-512: two vectors per chunk, so one chain per (r, b) is still latency-free
 * at 16 chains) lets a 4-row tile take four weight rows (and a 5- to 8-row tile two):
 * each x vector loaded serves several FMAs, which is what a B = 8 product is short of (x
 * reloads, not FMAs, set its pace). */
#ifndef NACC
#define NACC 2
#endif
/* How many x rows the next tile takes, of the `left` still to do: while 2 * BTMAX_SPLIT
 * or more are left, BTMAX_SPLIT (4 x-rows, 4 weight rows: 16 accumulators), else up to
 * BTMAX. On AVX-512 (Zen 4, one thread, a 512 x 1024 Q8_0 expert hot in cache, measured
 * in turns in one process) two 4 x 4 tiles beat one 8 x 2 tile by 8-13 % at 8, 16 and 30
 * x-rows (each x vector then serves 4 weight rows instead of 2); 5-7 rows gained nothing
 * from splitting. A product's bits do not depend on the tiles (see the tile below). */
AI int SFX(x_block)(int64_t left) {
    if (BTMAX > BTMAX_SPLIT && left >= 2 * BTMAX_SPLIT)
        return BTMAX_SPLIT;
    return (int)(left < BTMAX ? left : BTMAX);
}
#define DEF_TYPE(T, TAILED, VAL, SB, P, CS)                                                              \
    AI void SFX(tile_##T)(const uint8_t *w, size_t rb, const int R, const int BT,                \
                          const float *x, int64_t K, float *out, int64_t ldo) {                  \
        const int64_t nch = K / 32;                                                              \
        vf acc[4][8][NACC];                                                                      \
        for (int r = 0; r < R; r++)                                                              \
            for (int b = 0; b < BT; b++)                                                         \
                for (int a = 0; a < NACC; a++)                                                   \
                    acc[r][b][a] = VZERO;                                                        \
        kstate st[4];                                                                            \
        /* CS chunks per step (nch is a multiple of CS): c % CS is a compile-time constant */ \
        for (int64_t c0 = 0; c0 < nch; c0 += CS) {                                               \
            TILE_STEP_PREP(P, SB, CS);                                                           \
            for (int u = 0; u < CS; u++) {                                                       \
                const int64_t c = c0 + u;                                                        \
                for (int r = 0; r < R; r++) {                                                    \
                    vf wv[NV];                                                                   \
                    SFX(chunk_##T)(w + r * rb, c, wv, 0, &st[r], CS > 1 ? u : -1);               \
                    for (int b = 0; b < BT; b++) {                                               \
                        const float *xp = x + b * K + c * 32;                                    \
                        for (int v = 0; v < NV; v++)                                             \
                            acc[r][b][v % NACC] = VFMA(wv[v], VLOADU(xp + v * W), acc[r][b][v % NACC]); \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        float sums[4][8];                                                                        \
        TILE_SUMS(R, BT, NACC == 1 ? acc[r][b][0] : VADD(acc[r][b][0], acc[r][b][NACC - 1]), sums); \
        TILE_STORE(TAILED, VAL, sums);                                                           \
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
            for (int64_t b0 = 0, bt; b0 < B; b0 += bt) {                                         \
                bt = SFX(x_block)(B - b0);                                                       \
                int R = ACCS / (NACC * bt);                                                      \
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
        kstate st;                                                                               \
        for (int64_t c = 0; c < nch; c++) {                                                      \
            vf wv[NV];                                                                           \
            if (SB > 1 && c % SB == 0)                                                           \
                SFX(prep_##P)(row, c / SB, &st);                                                 \
            SFX(chunk_##T)(row, c, wv, 1, &st, -1);                                                  \
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

DEF_TYPE(q4_0, 0, none, 1, none, 1)
DEF_TYPE(q4_1, 0, none, 1, none, 1)
DEF_TYPE(q5_0, 0, none, 1, none, 1)
DEF_TYPE(q5_1, 0, none, 1, none, 1)
DEF_TYPE(q8_0, 0, none, 1, none, 1)
DEF_TYPE(q4_k, 0, none, 8, q4_k, 2)
DEF_TYPE(q5_k, 0, none, 8, q5_k, 2)
DEF_TYPE(q6_k, 0, none, 8, q6_k, 1)
DEF_TYPE(f32, 1, f32, 1, none, 1)
DEF_TYPE(f16, 1, f16, 1, none, 1)
DEF_TYPE(bf16, 1, bf16, 1, none, 1)
DEF_TYPE(mxfp4, 0, none, 1, none, 1)

#ifdef BF16DOT
/* The bfloat16 product (opt-in: PANTHEON_ACTIVATIONS=bfloat16; AVX-512 BF16 CPUs only).
 * Each chunk's 32 weight values are decoded as the float tile decodes them, then rounded
 * to bfloat16 (RNE) with x's 32 values (rounded once per call, x_to_bf16), and one
 * vdpbf16ps adds their 32 products into the (r, b) accumulator: one instruction where the
 * float tile spends two FMAs and two x loads. Per (r, b): chunks in order, one horizontal
 * sum, the float tail; nothing depends on R, BT, the other rows or r0 (batch invariant). */
static void SFX(x_to_bf16)(const float *x, int64_t B, int64_t K, __m512bh *xb) {
    const int64_t nch = K / 32;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < nch; c++) {
            const float *p = x + b * K + c * 32;
            xb[b * nch + c] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
        }
}

#define DEF_BF(T, TAILED, VAL, SB, P, CS)                                                        \
    AI void SFX(tilebf_##T)(const uint8_t *w, size_t rb, const int R, const int BT,              \
                            const __m512bh *xb, const float *x, int64_t K, float *out,           \
                            int64_t ldo) {                                                       \
        const int64_t nch = K / 32;                                                              \
        __m512 acc[4][8];                                                                        \
        for (int r = 0; r < R; r++)                                                              \
            for (int b = 0; b < BT; b++)                                                         \
                acc[r][b] = _mm512_setzero_ps();                                                 \
        kstate st[4];                                                                            \
        /* CS chunks per step (nch is a multiple of CS): c % CS is a compile-time constant */ \
        for (int64_t c0 = 0; c0 < nch; c0 += CS) {                                               \
            TILE_STEP_PREP(P, SB, CS);                                                           \
            for (int u = 0; u < CS; u++) {                                                       \
                const int64_t c = c0 + u;                                                        \
                __m512bh wb[4];                                                                  \
                for (int r = 0; r < R; r++) {                                                    \
                    vf wv[NV];                                                                   \
                    SFX(chunk_##T)(w + r * rb, c, wv, 0, &st[r], CS > 1 ? u : -1);               \
                    wb[r] = _mm512_cvtne2ps_pbh(wv[1], wv[0]);                                   \
                }                                                                                \
                for (int b = 0; b < BT; b++) {                                                   \
                    const __m512bh xv = xb[b * nch + c];                                         \
                    for (int r = 0; r < R; r++)                                                  \
                        acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wb[r], xv);                      \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        float sums[4][8];                                                                        \
        TILE_SUMS(R, BT, acc[r][b], sums);                                                       \
        TILE_STORE(TAILED, VAL, sums);                                                           \
    }                                                                                            \
    static void SFX(tilesbf_##T)(const uint8_t *w, size_t rb, int R, int BT, const __m512bh *xb, \
                                 const float *x, int64_t K, float *out, int64_t ldo) {           \
        switch (BT * 8 + R) {                                                                    \
            BF_TILE_CASES(T)                                                                     \
        default:                                                                                 \
            break;                                                                               \
        }                                                                                        \
    }                                                                                            \
    static void SFX(rowsbf_##T)(const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t K,  \
                                const float *x, const void *xbv, int64_t B, float *out,          \
                                int64_t ldo) {                                                   \
        const __m512bh *xb = xbv;                                                                \
        const int64_t nch = K / 32;                                                              \
        for (int64_t g = r0; g < r1; g += 4) {                                                   \
            const int64_t ge = g + 4 < r1 ? g + 4 : r1;                                          \
            for (int64_t b0 = 0; b0 < B; b0 += BTMAX) {                                          \
                const int bt = (int)(B - b0 < BTMAX ? B - b0 : BTMAX);                           \
                int R = ACCS / bt;                                                               \
                R = R >= 4 ? 4 : R >= 2 ? 2 : 1;                                                 \
                int64_t r = g;                                                                   \
                for (; r + R <= ge; r += R)                                                      \
                    SFX(tilesbf_##T)(w + r * rb, rb, R, bt, xb + b0 * nch, x + b0 * K, K,        \
                                     out + b0 * ldo + r, ldo);                                   \
                for (; r < ge; r++)                                                              \
                    SFX(tilesbf_##T)(w + r * rb, rb, 1, bt, xb + b0 * nch, x + b0 * K, K,        \
                                     out + b0 * ldo + r, ldo);                                   \
            }                                                                                    \
        }                                                                                        \
    }

#define BF_TILE_CASE(T, BT, R)                                                                   \
    case BT * 8 + R:                                                                             \
        SFX(tilebf_##T)(w, rb, R, BT, xb, x, K, out, ldo);                                       \
        break;
#define BF_TILE_CASES(T)                                                                         \
    BF_TILE_CASE(T, 1, 1) BF_TILE_CASE(T, 1, 4) BF_TILE_CASE(T, 2, 1) BF_TILE_CASE(T, 2, 4)      \
        BF_TILE_CASE(T, 3, 1) BF_TILE_CASE(T, 3, 4) BF_TILE_CASE(T, 4, 1) BF_TILE_CASE(T, 4, 4)  \
            BF_TILE_CASE(T, 5, 1) BF_TILE_CASE(T, 5, 2) BF_TILE_CASE(T, 6, 1)                    \
                BF_TILE_CASE(T, 6, 2) BF_TILE_CASE(T, 7, 1) BF_TILE_CASE(T, 7, 2)                \
                    BF_TILE_CASE(T, 8, 1) BF_TILE_CASE(T, 8, 2)

DEF_BF(q4_0, 0, none, 1, none, 1)
DEF_BF(q4_1, 0, none, 1, none, 1)
DEF_BF(q5_0, 0, none, 1, none, 1)
DEF_BF(q5_1, 0, none, 1, none, 1)
DEF_BF(q8_0, 0, none, 1, none, 1)
DEF_BF(q4_k, 0, none, 8, q4_k, 2)
DEF_BF(q5_k, 0, none, 8, q5_k, 2)
DEF_BF(q6_k, 0, none, 8, q6_k, 1)
DEF_BF(f32, 1, f32, 1, none, 1)
DEF_BF(f16, 1, f16, 1, none, 1)
DEF_BF(bf16, 1, bf16, 1, none, 1)
DEF_BF(mxfp4, 0, none, 1, none, 1)

static linear_bf_rows_fn SFX(linear_bf_for)(int qt) {
    switch (qt) {
    case QT_F32: return SFX(rowsbf_f32);
    case QT_F16: return SFX(rowsbf_f16);
    case QT_BF16: return SFX(rowsbf_bf16);
    case QT_Q4_0: return SFX(rowsbf_q4_0);
    case QT_Q4_1: return SFX(rowsbf_q4_1);
    case QT_Q5_0: return SFX(rowsbf_q5_0);
    case QT_Q5_1: return SFX(rowsbf_q5_1);
    case QT_Q8_0: return SFX(rowsbf_q8_0);
    case QT_Q4_K: return SFX(rowsbf_q4_k);
    case QT_Q5_K: return SFX(rowsbf_q5_k);
    case QT_Q6_K: return SFX(rowsbf_q6_k);
    case QT_MXFP4: return SFX(rowsbf_mxfp4);
    default: return NULL;
    }
}
#undef DEF_BF
#undef BF_TILE_CASE
#undef BF_TILE_CASES
#endif /* BF16DOT */

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
    case QT_MXFP4: return SFX(rows_mxfp4);
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
    case QT_MXFP4: return SFX(deq_mxfp4);
    default: return NULL;
    }
}
