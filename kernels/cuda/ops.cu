// The per-row operations of a decoder block (issue 16): RMSNorm, RoPE, the GLU
// activations, soft-capping. Twins: kernels/cuda_twins.py rms_norm, rope, glu, softcap.
// Each output row depends on its own input row only, so all are batch invariant. Compiled
// with --fmad=false: rms_norm and rope round every operation as the numpy reference does
// (bitwise its twin); expf and tanhf are CUDA's (within a few ulp of numpy's).

#define NORM_THREADS 256
#define ELEMENT_THREADS 256

// One block per row of D values: each thread sums the squares of x[t], x[t + 256], ... in
// order, then a fixed halving tree over the 256 partial sums; y = x * (1 / sqrt(ms + eps)) * w.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int D, float eps) {
    __shared__ float part[NORM_THREADS];
    int t = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * D;
    float* yr = y + (size_t)blockIdx.x * D;
    float s = 0.0f;
    for (int i = t; i < D; i += NORM_THREADS) s = s + xr[i] * xr[i];
    part[t] = s;
    __syncthreads();
    for (int half = NORM_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) part[t] = part[t] + part[t + half];
        __syncthreads();
    }
    float r = 1.0f / sqrtf(part[0] / (float)D + eps);
    for (int i = t; i < D; i += NORM_THREADS) yr[i] = xr[i] * r * w[i];
}

// x, y (n, H, Dh); cos, sin (n_pos, Dh / 2) indexed by pos[row]. One thread per rotated pair:
// the two halves (i, i + Dh/2) when neox, else adjacent values (2i, 2i + 1).
extern "C" __global__ void rope(const float* x, float* y, const int* pos, const float* cos,
                                const float* sin, int H, int Dh, int neox, long long pairs) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= pairs) return;
    int half = Dh / 2;
    int i = (int)(t % half);
    long long head = t / half;  // row * H + h
    int row = (int)(head / H);
    float c = cos[(size_t)pos[row] * half + i], s = sin[(size_t)pos[row] * half + i];
    size_t i0 = head * Dh + (neox ? i : 2 * i), i1 = i0 + (neox ? half : 1);
    float x0 = x[i0], x1 = x[i1];
    y[i0] = x0 * c - x1 * s;
    y[i1] = x0 * s + x1 * c;
}

// gate_up (n, 2F): gate | up per row -> y (n, F) = act(gate) * up, one thread per value.
// silu: exp(-g) overflows to inf below g = -88 and g / inf is the right limit, -0.
extern "C" __global__ void glu_silu(const float* gate_up, float* y, int F, long long count) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    const float* r = gate_up + (t / F) * 2 * F;
    float g = r[t % F], u = r[F + t % F];
    y[t] = g / (1.0f + expf(-g)) * u;
}

extern "C" __global__ void glu_gelu_tanh(const float* gate_up, float* y, int F, long long count) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) return;
    const float* r = gate_up + (t / F) * 2 * F;
    float g = r[t % F], u = r[F + t % F];
    float inner = 0.7978845608f * (g + 0.044715f * (g * g * g));
    y[t] = 0.5f * g * (1.0f + tanhf(inner)) * u;
}

extern "C" __global__ void softcap(const float* x, float* y, float cap, long long count) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < count) y[t] = cap * tanhf(x[t] / cap);
}
