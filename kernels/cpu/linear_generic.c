/* The portable C kernels of linear and dequantize (quants.h): what runs for a type or a
 * CPU without a SIMD kernel (PANTHEON_CPU_ISA=generic forces them), picked by
 * linear_kernel / dequant_kernel in linear.c. */
#include "quants.h"

/* Values of chunk c (32 values) of a row, computed exactly as gguf-py does. The
 * generic kernel's product uses the same values (no fused multiply-add). */
static inline __attribute__((always_inline)) void gen_chunk(const int qt, const uint8_t *row,
                                                            int64_t c, float *w) {
    switch (qt) {
    case QT_Q4_0: {
        const uint8_t *b = row + c * 18;
        const float d = fp16_to_f32(rd16(b));
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)((b[2 + i] & 15) - 8);
            w[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
        }
        break;
    }
    case QT_Q4_1: {
        const uint8_t *b = row + c * 20;
        const float d = fp16_to_f32(rd16(b)), m = fp16_to_f32(rd16(b + 2));
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)(b[4 + i] & 15) + m;
            w[i + 16] = d * (float)(b[4 + i] >> 4) + m;
        }
        break;
    }
    case QT_Q5_0: {
        const uint8_t *b = row + c * 22;
        const float d = fp16_to_f32(rd16(b));
        const uint32_t qh = rd32(b + 2);
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)((int)((b[6 + i] & 15) | (((qh >> i) & 1) << 4)) - 16);
            w[i + 16] = d * (float)((int)((b[6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
        }
        break;
    }
    case QT_Q5_1: {
        const uint8_t *b = row + c * 24;
        const float d = fp16_to_f32(rd16(b)), m = fp16_to_f32(rd16(b + 2));
        const uint32_t qh = rd32(b + 4);
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)((b[8 + i] & 15) | (((qh >> i) & 1) << 4)) + m;
            w[i + 16] = d * (float)((b[8 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)) + m;
        }
        break;
    }
    case QT_Q8_0: {
        const uint8_t *b = row + c * 34;
        const float d = fp16_to_f32(rd16(b));
        for (int i = 0; i < 32; i++)
            w[i] = (float)(int8_t)b[2 + i] * d;
        break;
    }
    case QT_MXFP4: { /* e2m1 codes, doubled, times the halved E8M0 scale: exact products */
        static const int8_t kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
        const uint8_t *b = row + c * 17;
        const float d = e8m0_to_f32_half(b[0]);
        for (int i = 0; i < 16; i++) {
            w[i] = d * (float)kvalues[b[1 + i] & 15];
            w[i + 16] = d * (float)kvalues[b[1 + i] >> 4];
        }
        break;
    }
    case QT_Q4_K:
    case QT_Q5_K: {
        const int ts = qt == QT_Q4_K ? 144 : 176;
        const uint8_t *sb = row + (c >> 3) * ts;
        const int j = (int)(c & 7);
        int sc, mn;
        kq_scale_min(sb + 4, j, &sc, &mn);
        const float d = fp16_to_f32(rd16(sb)) * (float)sc;
        const float m = fp16_to_f32(rd16(sb + 2)) * (float)mn;
        const uint8_t *qs = sb + (qt == QT_Q4_K ? 16 : 48) + 32 * (j >> 1);
        const int shift = 4 * (j & 1);
        for (int i = 0; i < 32; i++) {
            int q = (qs[i] >> shift) & 15;
            if (qt == QT_Q5_K)
                q |= ((sb[16 + i] >> j) & 1) << 4;
            w[i] = d * (float)q - m;
        }
        break;
    }
    case QT_Q6_K: {
        const uint8_t *sb = row + (c >> 3) * 210;
        const int j = (int)(c & 7), g = j >> 2, s = j & 3;
        const uint8_t *ql = sb + 64 * g + 32 * (s & 1), *qh = sb + 128 + 32 * g;
        const int8_t *sc = (const int8_t *)(sb + 192);
        const float d = fp16_to_f32(rd16(sb + 208));
        const float d0 = d * (float)sc[2 * j], d1 = d * (float)sc[2 * j + 1];
        for (int i = 0; i < 32; i++) {
            const int q = ((ql[i] >> (4 * (s >> 1))) & 15) | (((qh[i] >> (2 * s)) & 3) << 4);
            w[i] = (i < 16 ? d0 : d1) * (float)(q - 32);
        }
        break;
    }
    case QT_F32:
        memcpy(w, row + c * 128, 128);
        break;
    case QT_F16:
        for (int i = 0; i < 32; i++)
            w[i] = fp16_to_f32(rd16(row + c * 64 + 2 * i));
        break;
    case QT_BF16:
        for (int i = 0; i < 32; i++)
            w[i] = bf16_to_f32(rd16(row + c * 64 + 2 * i));
        break;
    default:
        break;
    }
}

static inline float gen_val(int qt, const uint8_t *row, int64_t k) {
    switch (qt) {
    case QT_F32: {
        float f;
        memcpy(&f, row + 4 * k, 4);
        return f;
    }
    case QT_F16: return fp16_to_f32(rd16(row + 2 * k));
    case QT_BF16: return bf16_to_f32(rd16(row + 2 * k));
    default: return 0.f;
    }
}

#define GEN_BT 4

/* One weight row times BT x-rows; 32 lane accumulators per x-row, summed in lane order. */
static inline __attribute__((always_inline)) void gen_tile(const int qt, const uint8_t *row,
                                                           const int BT, const float *x, int64_t K,
                                                           float *out, int64_t ldo) {
    const int64_t nch = K / 32;
    float acc[GEN_BT][32];
    float w[32];
    for (int b = 0; b < BT; b++)
        for (int i = 0; i < 32; i++)
            acc[b][i] = 0.f;
    for (int64_t c = 0; c < nch; c++) {
        gen_chunk(qt, row, c, w);
        for (int b = 0; b < BT; b++) {
            const float *xp = x + b * K + c * 32;
            for (int i = 0; i < 32; i++)
                acc[b][i] += w[i] * xp[i];
        }
    }
    for (int b = 0; b < BT; b++) {
        float s = 0.f;
        for (int i = 0; i < 32; i++)
            s += acc[b][i];
        for (int64_t k = nch * 32; k < K; k++)
            s += gen_val(qt, row, k) * x[b * K + k];
        out[b * ldo] = s;
    }
}

#define GEN_TYPE(T, QT)                                                                          \
    static void gen_rows_##T(const uint8_t *w, size_t rb, int64_t r0, int64_t r1, int64_t K,     \
                             const float *x, int64_t B, float *out, int64_t ldo) {               \
        for (int64_t r = r0; r < r1; r++)                                                        \
            for (int64_t b0 = 0; b0 < B; b0 += GEN_BT) {                                         \
                const float *xb = x + b0 * K;                                                    \
                float *ob = out + b0 * ldo + r;                                                  \
                switch (B - b0 < GEN_BT ? (int)(B - b0) : GEN_BT) {                              \
                case 1: gen_tile(QT, w + r * rb, 1, xb, K, ob, ldo); break;                      \
                case 2: gen_tile(QT, w + r * rb, 2, xb, K, ob, ldo); break;                      \
                case 3: gen_tile(QT, w + r * rb, 3, xb, K, ob, ldo); break;                      \
                default: gen_tile(QT, w + r * rb, 4, xb, K, ob, ldo); break;                     \
                }                                                                                \
            }                                                                                    \
    }                                                                                            \
    static void gen_deq_##T(const uint8_t *row, int64_t K, float *out) {                         \
        const int64_t nch = K / 32;                                                              \
        for (int64_t c = 0; c < nch; c++)                                                        \
            gen_chunk(QT, row, c, out + c * 32);                                                 \
        for (int64_t k = nch * 32; k < K; k++)                                                   \
            out[k] = gen_val(QT, row, k);                                                        \
    }

GEN_TYPE(q4_0, QT_Q4_0)
GEN_TYPE(q4_1, QT_Q4_1)
GEN_TYPE(q5_0, QT_Q5_0)
GEN_TYPE(q5_1, QT_Q5_1)
GEN_TYPE(q8_0, QT_Q8_0)
GEN_TYPE(q4_k, QT_Q4_K)
GEN_TYPE(q5_k, QT_Q5_K)
GEN_TYPE(q6_k, QT_Q6_K)
GEN_TYPE(f32, QT_F32)
GEN_TYPE(f16, QT_F16)
GEN_TYPE(bf16, QT_BF16)
GEN_TYPE(mxfp4, QT_MXFP4)

#define SFX(name) name##_generic
linear_rows_fn SFX(linear_for)(int qt) {
    switch (qt) {
    case QT_F32: return gen_rows_f32;
    case QT_F16: return gen_rows_f16;
    case QT_BF16: return gen_rows_bf16;
    case QT_Q4_0: return gen_rows_q4_0;
    case QT_Q4_1: return gen_rows_q4_1;
    case QT_Q5_0: return gen_rows_q5_0;
    case QT_Q5_1: return gen_rows_q5_1;
    case QT_Q8_0: return gen_rows_q8_0;
    case QT_Q4_K: return gen_rows_q4_k;
    case QT_Q5_K: return gen_rows_q5_k;
    case QT_Q6_K: return gen_rows_q6_k;
    case QT_MXFP4: return gen_rows_mxfp4;
    default: return NULL;
    }
}
dequant_row_fn SFX(dequant_for)(int qt) {
    switch (qt) {
    case QT_F32: return gen_deq_f32;
    case QT_F16: return gen_deq_f16;
    case QT_BF16: return gen_deq_bf16;
    case QT_Q4_0: return gen_deq_q4_0;
    case QT_Q4_1: return gen_deq_q4_1;
    case QT_Q5_0: return gen_deq_q5_0;
    case QT_Q5_1: return gen_deq_q5_1;
    case QT_Q8_0: return gen_deq_q8_0;
    case QT_Q4_K: return gen_deq_q4_k;
    case QT_Q5_K: return gen_deq_q5_k;
    case QT_Q6_K: return gen_deq_q6_k;
    case QT_MXFP4: return gen_deq_mxfp4;
    default: return NULL;
    }
}
#undef SFX
