// Decode attention over the device KV cache (issue 16): kernels/xp_backend.XpKVCache's
// layout, keys and values (n_layer, n_slots, Hkv, n_ctx, Dh) float32. Twin:
// kernels/cuda_twins.py attention_decode.
//
// Flash decoding: a row's visible positions are cut at multiples of ATT_CHUNK (boundaries
// fixed by the position alone, never by the batch), one block per (chunk, query head, row)
// computes that chunk's softmax numerator and sum against its own maximum, and
// attention_combine rescales the chunks to their common maximum, in chunk order. A row's
// result depends only on its q, its slot's keys and values and its position: batch
// invariant, bitwise. Long contexts spread over many SMs (one block per chunk).
//
// Visible positions for a query at p: lo .. p, lo = max(0, p + 1 - window) when window > 0
// (keys `window` or more positions behind are hidden), else 0.

#define ATT_CHUNK 256
#define ATT_THREADS 128
#define ATT_MAX_HEAD_DIM 256
static_assert(ATT_CHUNK == 2 * ATT_THREADS, "each thread holds two scores of a chunk");
#define NEG_INF __uint_as_float(0xff800000u)  // NVRTC has no <math.h> INFINITY

__device__ __forceinline__ size_t cache_row(int layer, int n_slots, int slot, int Hkv, int hk,
                                            int n_ctx) {
    return (((size_t)layer * n_slots + slot) * Hkv + hk) * n_ctx;
}

__device__ __forceinline__ int first_visible(int p, int window) {
    return window > 0 ? max(0, p + 1 - window) : 0;
}

// Both kernels start with the cache and where rows go in it: caches, slots, pos, layer and
// the cache's shape. k, v (B, Hkv, Dh) into the cache at (layer, slots[b], :, pos[b]); one
// thread per value.
extern "C" __global__ void kv_write(float* kc, float* vc, const int* slots, const int* pos,
                                    int layer, int n_slots, int Hkv, int n_ctx, int Dh,
                                    const float* k, const float* v, int B) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * Hkv * Dh) return;
    int b = t / (Hkv * Dh), hk = (t / Dh) % Hkv, d = t % Dh;
    size_t at = (cache_row(layer, n_slots, slots[b], Hkv, hk, n_ctx) + pos[b]) * Dh + d;
    kc[at] = k[t];
    vc[at] = v[t];
}

// grid (n_chunks, H, B), ATT_THREADS threads. Writes, for chunk c of row b's head h:
// part_m the chunk's largest score, part_l the sum of exp(score - m), part_o (Dh) the sum
// of exp(score - m) * value; chunks holding no visible position write nothing.
extern "C" __global__ void attention_chunk(const float* kc, const float* vc, const int* slots,
                                           const int* pos, int layer, int n_slots, int Hkv,
                                           int n_ctx, int Dh, const float* q, int H, int n_chunks,
                                           float scale, int window, float softcap, float* part_o,
                                           float* part_m, float* part_l) {
    __shared__ float qs[ATT_MAX_HEAD_DIM];
    __shared__ float e[ATT_CHUNK];
    __shared__ float red[ATT_THREADS];
    int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, t = threadIdx.x;
    int lane = t & 31, warp = t / 32;
    int p = pos[b], lo = first_visible(p, window);
    int first = max(lo, c * ATT_CHUNK), last = min(p, c * ATT_CHUNK + ATT_CHUNK - 1);
    if (first > last) return;
    int hk = h / (H / Hkv);  // GQA: query heads share KV heads in consecutive groups
    size_t base = cache_row(layer, n_slots, slots[b], Hkv, hk, n_ctx);
    const float* keys = kc + base * Dh;
    const float* values = vc + base * Dh;
    for (int d = t; d < Dh; d += ATT_THREADS) qs[d] = q[((size_t)b * H + h) * Dh + d] * scale;
    __syncthreads();

    // Scores: one warp per position, lanes over Dh, a fixed xor-shuffle tree.
    for (int j = warp; j < ATT_CHUNK; j += ATT_THREADS / 32) {
        int kp = c * ATT_CHUNK + j;
        if (kp < first || kp > last) {  // warp-uniform
            if (lane == 0) e[j] = NEG_INF;
            continue;
        }
        const float* key = keys + (size_t)kp * Dh;
        float s = 0.0f;
        for (int d = lane; d < Dh; d += 32) s = s + qs[d] * key[d];
        for (int off = 16; off > 0; off >>= 1) s = s + __shfl_xor_sync(0xffffffffu, s, off);
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        if (lane == 0) e[j] = s;
    }
    __syncthreads();

    // The chunk's maximum, then exp(score - max) and their sum: fixed halving trees.
    red[t] = fmaxf(e[t], e[t + ATT_THREADS]);
    __syncthreads();
    for (int half = ATT_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) red[t] = fmaxf(red[t], red[t + half]);
        __syncthreads();
    }
    float m = red[0];
    __syncthreads();
    e[t] = expf(e[t] - m);  // hidden positions: exp(-inf) = 0
    e[t + ATT_THREADS] = expf(e[t + ATT_THREADS] - m);
    red[t] = e[t] + e[t + ATT_THREADS];
    __syncthreads();
    for (int half = ATT_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) red[t] = red[t] + red[t + half];
        __syncthreads();
    }

    // The weighted values: one thread per dimension, positions in order.
    size_t at = ((size_t)b * H + h) * n_chunks + c;
    for (int d = t; d < Dh; d += ATT_THREADS) {
        float o = 0.0f;
        for (int kp = first; kp <= last; ++kp)
            o = o + e[kp - c * ATT_CHUNK] * values[(size_t)kp * Dh + d];
        part_o[at * Dh + d] = o;
    }
    if (t == 0) {
        part_m[at] = m;
        part_l[at] = red[0];
    }
}

// grid (H, B), ATT_THREADS threads: out (B, H * Dh) = the chunks' numerators over their
// sums, each rescaled by exp(m_c - max m), chunks in order.
extern "C" __global__ void attention_combine(const float* part_o, const float* part_m,
                                             const float* part_l, const int* pos, float* out,
                                             int H, int Dh, int n_chunks, int window) {
    int h = blockIdx.x, b = blockIdx.y;
    int p = pos[b];
    int c0 = first_visible(p, window) / ATT_CHUNK, c1 = p / ATT_CHUNK;
    size_t at = ((size_t)b * H + h) * n_chunks;
    float m = NEG_INF;
    for (int c = c0; c <= c1; ++c) m = fmaxf(m, part_m[at + c]);
    for (int d = threadIdx.x; d < Dh; d += ATT_THREADS) {
        float l = 0.0f, o = 0.0f;
        for (int c = c0; c <= c1; ++c) {
            float w = expf(part_m[at + c] - m);
            l = l + part_l[at + c] * w;
            o = o + part_o[(at + c) * Dh + d] * w;
        }
        out[((size_t)b * H + h) * Dh + d] = o / l;
    }
}
