/* KV cache rows in float32, float16 or Q8_0 (see kv.h). */
#include "kv.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KV_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KV_CLONES
#endif

typedef struct {
    _Float16 d;
    int8_t qs[KV_QK];
} __attribute__((packed)) kv_block_q8;

int64_t kv_row_bytes(int type, int64_t Dh) {
    switch (type) {
    case KV_F16:
        return Dh * (int64_t)sizeof(_Float16);
    case KV_Q8_0:
        return Dh / KV_QK * (int64_t)sizeof(kv_block_q8);
    default:
        return Dh * (int64_t)sizeof(float);
    }
}

KV_CLONES static void store_f16(const float *src, int64_t Dh, _Float16 *dst) {
    for (int64_t d = 0; d < Dh; d++)
        dst[d] = (_Float16)src[d];
}

static void store_q8(const float *src, int64_t Dh, kv_block_q8 *dst) {
    for (int64_t b = 0; b < Dh / KV_QK; b++) {
        const float *x = src + b * KV_QK;
        float amax = 0.f;
        for (int j = 0; j < KV_QK; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.f;
        for (int j = 0; j < KV_QK; j++)
            dst[b].qs[j] = d != 0.f ? (int8_t)roundf(x[j] / d) : 0;
        dst[b].d = (_Float16)d;
    }
}

void kv_store_row(int type, const float *src, int64_t Dh, void *dst) {
    switch (type) {
    case KV_F16:
        store_f16(src, Dh, dst);
        break;
    case KV_Q8_0:
        store_q8(src, Dh, dst);
        break;
    default:
        memcpy(dst, src, (size_t)Dh * sizeof(float));
    }
}

KV_CLONES static void rows_f16(const _Float16 *src, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

KV_CLONES static void rows_q8(const kv_block_q8 *src, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = (float)src[b].d;
        for (int j = 0; j < KV_QK; j++)
            dst[b * KV_QK + j] = d * (float)src[b].qs[j];
    }
}

void kv_rows_f32(int type, const void *rows, int64_t n, int64_t Dh, float *dst) {
    switch (type) {
    case KV_F16:
        rows_f16(rows, n * Dh, dst);
        break;
    case KV_Q8_0:
        rows_q8(rows, n * (Dh / KV_QK), dst);
        break;
    default:
        memcpy(dst, rows, (size_t)(n * Dh) * sizeof(float));
    }
}
