// The models and the reference of bench/decode_megakernel_bench.cu: shapes, weights, a chain
// of naive kernels (one per operation, f32 with f64 sums) to check the persistent kernel
// against, random fills and a plain HBM read for the bandwidth limit.
#pragma once
#include <algorithm>
#include <vector>

#include "device_primitives.cuh"

constexpr int kHeadDim = 64;

struct Model {
    const char* name;
    int H, I, heads, kv_heads, layers, vocab;
    bool gated;  // SwiGLU with gate|up rows interleaved (Llama) instead of GELU (GPT-2)
    __host__ __device__ int qkvRows() const { return H + 2 * kv_heads * kHeadDim; }
    __host__ __device__ int fcRows() const { return gated ? 2 * I : I; }
    double weightBytes() const { return 2.0 * (double(layers) * ((qkvRows() + H + fcRows()) * double(H) + double(H) * I) + double(vocab) * H); }
};

struct Layer {
    const __half *qkv, *o, *fc, *down;  // [rows][K] row-major
    const __half *k_cache, *v_cache;    // [kv_heads][ctx][64]
};

// ---- the reference: one naive kernel per operation, f32 ----
__global__ void refNorm(const float* r, float* x, int H, bool rms) {
    __shared__ float red[2][32];
    float s = 0.f, q = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) s += r[j], q += r[j] * r[j];
    s = warpSum(s), q = warpSum(q);
    if (threadIdx.x % 32 == 0) red[0][threadIdx.x / 32] = s, red[1][threadIdx.x / 32] = q;
    __syncthreads();
    s = q = 0.f;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += red[0][w], q += red[1][w];
    const float mean = rms ? 0.f : s / H, inv = rsqrtf(q / H - mean * mean + 1e-5f);
    for (int j = threadIdx.x; j < H; j += blockDim.x) x[j] = (r[j] - mean) * inv;
}
__global__ void refGemv(const __half* W, const float* x, float* y, int N, int K) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    double acc = 0.0;
    for (int k = 0; k < K; ++k) acc += double(__half2float(W[size_t(n) * K + k])) * x[k];
    y[n] = float(acc);
}
__global__ void refAdd(float* r, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) r[i] += y[i];
}
__global__ void refActivation(const float* y, float* h, int I, bool gated) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < I) h[i] = gated ? y[2 * i] / (1.f + expf(-y[2 * i])) * y[2 * i + 1] : gelu(y[i]);
}
__global__ void refAttention(Model m, Layer L, int ctx, const float* qkv, float* out) {
    const int h = blockIdx.x, d = threadIdx.x, kvh = h / (m.heads / m.kv_heads);
    const float* q = qkv + h * kHeadDim;
    const float *kn = qkv + m.H + kvh * kHeadDim, *vn = qkv + m.H + m.kv_heads * kHeadDim + kvh * kHeadDim;
    auto key = [&](int i, int j) { return i < ctx ? __half2float(L.k_cache[(size_t(kvh) * ctx + i) * kHeadDim + j]) : __half2float(__float2half(kn[j])); };
    auto value = [&](int i, int j) { return i < ctx ? __half2float(L.v_cache[(size_t(kvh) * ctx + i) * kHeadDim + j]) : __half2float(__float2half(vn[j])); };
    double M = -1e300;
    for (int i = 0; i <= ctx; ++i) {
        double s = 0.0;
        for (int j = 0; j < kHeadDim; ++j) s += double(q[j]) * key(i, j);
        M = fmax(M, s / sqrt(double(kHeadDim)));
    }
    double sum = 0.0, acc = 0.0;
    for (int i = 0; i <= ctx; ++i) {
        double s = 0.0;
        for (int j = 0; j < kHeadDim; ++j) s += double(q[j]) * key(i, j);
        const double w = exp(s / sqrt(double(kHeadDim)) - M);
        sum += w;
        acc += w * value(i, d);
    }
    out[h * kHeadDim + d] = float(acc / sum);
}

__global__ void fillRandom(__half* w, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        unsigned v = unsigned(i) * 2654435761u ^ seed * 0x9E3779B9u ^ unsigned(i >> 32) * 0x85EBCA6Bu;
        v ^= v >> 15, v *= 0x2C1B3C6Du, v ^= v >> 12, v *= 0x297A2D39u, v ^= v >> 15;
        w[i] = __float2half((float(v & 0xFFFFFF) / float(0x1000000) * 2.f - 1.f) * scale);
    }
}
__global__ void readAll(const uint4* src, size_t n, unsigned* sink) {
    unsigned x = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = i + u * stride < n ? __ldcs(src + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x12345678u) *sink = x;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

static double measureBandwidth(int sms) {
    const size_t bytes = size_t(4) << 30;
    uint4* buf;
    unsigned* sink;
    CHECK(cudaMalloc(&buf, bytes));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(buf, 1, bytes));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<double> gbs;
    for (int i = 0; i < 12; ++i) {
        CHECK(cudaEventRecord(a));
        readAll<<<sms * 4, 512>>>(buf, bytes / 16, sink);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (i > 1) gbs.push_back(bytes / (ms * 1e-3) / 1e9);
    }
    CHECK(cudaFree(buf));
    CHECK(cudaFree(sink));
    return median(gbs);
}

