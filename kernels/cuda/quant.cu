// Matrices in GGUF blocks (issue 16): the decode mat-vec and the prefill dequantisation.
// Twins: kernels/cuda_twins.py matvec and dequantize.
//
// matvec_<type>: y[b, n] = sum_k W[n, k] x[b, k]. One warp per weight row n, a block of
// MATVEC_ROWS warps, and a tile of up to MATVEC_TILE x-rows per grid row (blockIdx.y).
// Lane l owns values 256 i + 8 l .. + 7 of the row for i = 0, 1, ...: it decodes them once
// and adds each times x into the tile's accumulators, in that order; then one fixed
// xor-shuffle tree sums the 32 lanes. So y[b, n] depends only on row n and x[b], never on
// B or on the other x-rows: batch invariant, bitwise.
#include "blocks.cuh"

#define MATVEC_ROWS 4
#define MATVEC_TILE 8

// A lane's 8 values of an x-row as two 16-byte loads (x 16-byte aligned and K a multiple of
// 8: the launcher sees to it), not eight 4-byte ones: on an H200 the mat-vec at 64 x-rows
// was stalled on those loads (ncu: L1TEX scoreboard, 58 % of its cycles). The products and
// sums stay in j order, so the bits do not change. The emulator defines this with an
// alignment check.
#ifndef PN_FLOAT4_AT
#define PN_FLOAT4_AT(p) (*reinterpret_cast<const float4*>(p))
#endif

template <class T>
__device__ void matvec(const u8* W, const float* x, float* y, int N, int K, int B, int ldy) {
    int lane = threadIdx.x & 31;
    int n = blockIdx.x * MATVEC_ROWS + threadIdx.x / 32;
    if (n >= N) return;  // whole warps only: the shuffles below see all 32 lanes
    int b0 = blockIdx.y * MATVEC_TILE;
    int nb = min(MATVEC_TILE, B - b0);
    const u8* row = W + (size_t)n * (K / T::VALUES) * T::BYTES;
    const float* xt = x + (size_t)b0 * K;
    float acc[MATVEC_TILE];
    for (int b = 0; b < MATVEC_TILE; ++b) acc[b] = 0.0f;
    for (int pos = lane * 8; pos < K; pos += 256) {
        float w[8];
        T::decode8(row + (pos / T::VALUES) * T::BYTES, pos % T::VALUES, w);
#pragma unroll
        for (int b = 0; b < MATVEC_TILE; ++b) {
            if (b < nb) {
                const float* xb = xt + (size_t)b * K + pos;
                float4 lo = PN_FLOAT4_AT(xb), hi = PN_FLOAT4_AT(xb + 4);
                float xv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                for (int j = 0; j < 8; ++j) acc[b] = acc[b] + w[j] * xv[j];
            }
        }
    }
#pragma unroll
    for (int b = 0; b < MATVEC_TILE; ++b) {
        float v = acc[b];
        for (int off = 16; off > 0; off >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && b < nb) y[(size_t)(b0 + b) * ldy + n] = v;
    }
}

// One thread per 8 values: out (N, K) float32, the values xp_quants.dequantize gives.
template <class T>
__device__ void dequantize(const u8* W, float* out, int N, int K) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)N * (K / 8)) return;
    int n = (int)(i / (K / 8)), pos = (int)(i % (K / 8)) * 8;
    const u8* row = W + (size_t)n * (K / T::VALUES) * T::BYTES;
    float w[8];
    T::decode8(row + (pos / T::VALUES) * T::BYTES, pos % T::VALUES, w);
    float* o = out + (size_t)n * K + pos;
    for (int j = 0; j < 8; ++j) o[j] = w[j];
}

#define PANTHEON_QUANT_KERNELS(name, T)                                                    \
    extern "C" __global__ void matvec_##name(const u8* W, const float* x, float* y, int N, \
                                             int K, int B, int ldy) {                      \
        matvec<T>(W, x, y, N, K, B, ldy);                                                  \
    }                                                                                      \
    extern "C" __global__ void dequantize_##name(const u8* W, float* out, int N, int K) {  \
        dequantize<T>(W, out, N, K);                                                       \
    }

PANTHEON_BLOCK_TYPES(PANTHEON_QUANT_KERNELS)
