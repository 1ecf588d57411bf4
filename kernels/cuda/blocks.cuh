// GGUF block types decoded eight values at a time (issue 16), shared by the mat-vec and
// dequantise kernels of quant.cu. Each decoder mirrors kernels/xp_quants.py operation for
// operation (compiled with --fmad=false, every product and sum rounds as numpy's does), so
// the values are bitwise gguf-py's; tests/kernels/test_cuda_sources.py compiles this file
// for the host (a two-line shim for __device__ and __uint_as_float) and checks exactly that.
//
// NVRTC has no standard headers: no <cstdint>, no <cuda_fp16.h>; float16 and bfloat16 are
// decoded from their bits here.
#ifndef PANTHEON_BLOCKS_CUH
#define PANTHEON_BLOCKS_CUH

typedef unsigned char u8;

// Blocks sit at any byte offset (Q4_0 is 18 bytes), so multi-byte fields are read bytewise.
__device__ __forceinline__ unsigned ld16(const u8* p) { return p[0] | (p[1] << 8); }

__device__ __forceinline__ unsigned ld32(const u8* p) {
    return p[0] | (p[1] << 8) | (p[2] << 16) | ((unsigned)p[3] << 24);
}

// IEEE half -> float, exact (every half is a float): rebias the exponent; subnormals are
// m * 2^-24, also exact in float.
__device__ __forceinline__ float f16(const u8* p) {
    unsigned h = ld16(p);
    unsigned sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;  // 2^-24
        return sign ? -v : v;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));  // inf, NaN
    return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}

__device__ __forceinline__ float bf16(const u8* p) { return __uint_as_float(ld16(p) << 16); }

// Each type: VALUES per block, BYTES per block, and decode8(block, j0, w) writing values
// j0 .. j0 + 7 of the block (j0 a multiple of 8). The float types use 32-value "blocks"
// so every type walks a row the same way.

struct Q4_0 {
    enum { VALUES = 32, BYTES = 18 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        float d = f16(b);
        const u8* qs = b + 2 + (j0 & 15);  // values 0..15: low nibbles; 16..31: high
        int shift = j0 >= 16 ? 4 : 0;
        for (int j = 0; j < 8; ++j) w[j] = d * (float)(((qs[j] >> shift) & 15) - 8);
    }
};

struct Q4_1 {
    enum { VALUES = 32, BYTES = 20 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        float d = f16(b), m = f16(b + 2);
        const u8* qs = b + 4 + (j0 & 15);
        int shift = j0 >= 16 ? 4 : 0;
        for (int j = 0; j < 8; ++j) w[j] = d * (float)((qs[j] >> shift) & 15) + m;
    }
};

struct Q5_0 {
    enum { VALUES = 32, BYTES = 22 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        float d = f16(b);
        unsigned qh = ld32(b + 2);  // bit i: the fifth bit of value i
        const u8* qs = b + 6 + (j0 & 15);
        int shift = j0 >= 16 ? 4 : 0;
        for (int j = 0; j < 8; ++j) {
            int q = ((qs[j] >> shift) & 15) | (((qh >> (j0 + j)) & 1) << 4);
            w[j] = d * (float)(q - 16);
        }
    }
};

struct Q5_1 {
    enum { VALUES = 32, BYTES = 24 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        float d = f16(b), m = f16(b + 2);
        unsigned qh = ld32(b + 4);
        const u8* qs = b + 8 + (j0 & 15);
        int shift = j0 >= 16 ? 4 : 0;
        for (int j = 0; j < 8; ++j) {
            int q = ((qs[j] >> shift) & 15) | (((qh >> (j0 + j)) & 1) << 4);
            w[j] = d * (float)q + m;
        }
    }
};

struct Q8_0 {
    enum { VALUES = 32, BYTES = 34 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        float d = f16(b);
        for (int j = 0; j < 8; ++j) w[j] = (float)(signed char)b[2 + j0 + j] * d;
    }
};

// Q4_K / Q5_K: sub-block s (32 values) of a 256-value super-block has a 6-bit scale and
// min packed in 12 bytes: s < 4 in the low bits of bytes s and s + 4; s >= 4 in the
// nibbles of byte s + 4 with its top two bits in bytes s - 4 and s.
__device__ __forceinline__ void k_scale_min(const u8* s, int j, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *mn = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 2) & 0x30));
        *mn = (float)((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30));
    }
}

// Sub-block s's values are the low (s even) or high (s odd) nibbles of qs[32 (s/2) ..].
struct Q4_K {
    enum { VALUES = 256, BYTES = 144 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        int s = j0 / 32, i0 = j0 % 32;
        float sc, mn;
        k_scale_min(b + 4, s, &sc, &mn);
        float d = f16(b) * sc, dm = f16(b + 2) * mn;
        const u8* qs = b + 16 + 32 * (s / 2) + i0;
        int shift = (s & 1) * 4;
        for (int j = 0; j < 8; ++j) w[j] = d * (float)((qs[j] >> shift) & 15) - dm;
    }
};

// As Q4_K, plus a fifth bit: bit s of qh[i] for value i of sub-block s.
struct Q5_K {
    enum { VALUES = 256, BYTES = 176 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        int s = j0 / 32, i0 = j0 % 32;
        float sc, mn;
        k_scale_min(b + 4, s, &sc, &mn);
        float d = f16(b) * sc, dm = f16(b + 2) * mn;
        const u8* qh = b + 16 + i0;
        const u8* qs = b + 48 + 32 * (s / 2) + i0;
        int shift = (s & 1) * 4;
        for (int j = 0; j < 8; ++j) {
            int q = ((qs[j] >> shift) & 15) | (((qh[j] >> s) & 1) << 4);
            w[j] = d * (float)q - dm;
        }
    }
};

// Q6_K: two halves of 128 values; in half h, group r (32 values) takes the low (r < 2) or
// high nibbles of ql[64 h + 32 (r & 1) ..] and bits 2r, 2r + 1 of qh[32 h ..]; one signed
// 8-bit scale per 16 values, times the block's d.
struct Q6_K {
    enum { VALUES = 256, BYTES = 210 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        int g = j0 / 32, i0 = j0 % 32, h = g / 4, r = g % 4;
        const u8* ql = b + 64 * h + 32 * (r & 1) + i0;
        const u8* qh = b + 128 + 32 * h + i0;
        float d = f16(b + 208) * (float)(signed char)b[192 + j0 / 16];
        int shift = (r >> 1) * 4;
        for (int j = 0; j < 8; ++j) {
            int q = ((ql[j] >> shift) & 15) | (((qh[j] >> (2 * r)) & 3) << 4);
            w[j] = d * (float)(q - 32);
        }
    }
};

struct F32 {
    enum { VALUES = 32, BYTES = 128 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        for (int j = 0; j < 8; ++j) w[j] = __uint_as_float(ld32(b + 4 * (j0 + j)));
    }
};

struct F16 {
    enum { VALUES = 32, BYTES = 64 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        for (int j = 0; j < 8; ++j) w[j] = f16(b + 2 * (j0 + j));
    }
};

struct BF16 {
    enum { VALUES = 32, BYTES = 64 };
    __device__ static void decode8(const u8* b, int j0, float* w) {
        for (int j = 0; j < 8; ++j) w[j] = bf16(b + 2 * (j0 + j));
    }
};

// Every type as X(kernel suffix, decoder): quant.cu expands it into one mat-vec and one
// dequantise kernel per type.
#define PANTHEON_BLOCK_TYPES(X) \
    X(q4_0, Q4_0)               \
    X(q4_1, Q4_1)               \
    X(q5_0, Q5_0)               \
    X(q5_1, Q5_1)               \
    X(q8_0, Q8_0)               \
    X(q4_k, Q4_K)               \
    X(q5_k, Q5_K)               \
    X(q6_k, Q6_K)               \
    X(f32, F32)                 \
    X(f16, F16)                 \
    X(bf16, BF16)

#endif
