#include "llm/cuda/decoder_kernels.h"

#include <math.h>

#include <algorithm>

namespace kiln::llm::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kAttentionThreads = 256;
constexpr int kAttentionTile = 256;  // keys whose scores are held in shared memory at once

__device__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warpMax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over a block of Threads threads; every thread gets the result.
template <int Threads>
__device__ float blockReduce(float v, float* shared, bool max) {
    v = max ? warpMax(v) : warpSum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // shared may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const float idle = max ? -INFINITY : 0.f;
    const float t = lane < Threads / 32 ? shared[lane] : idle;
    return max ? warpMax(t) : warpSum(t);
}

__device__ float blockSum(float v, float* shared) { return blockReduce<kNormThreads>(v, shared, false); }

__global__ void embedKernel(int H, StepMeta m, const __half* wte, const __half* wpe, float* x) {
    const int t = blockIdx.x;
    const int64_t tok = m.tokens[t], pos = m.positions[t];
    for (int j = threadIdx.x; j < H; j += blockDim.x)
        x[int64_t(t) * H + j] = __half2float(wte[tok * H + j]) + (wpe ? __half2float(wpe[pos * H + j]) : 0.f);
}

// out = LayerNorm/RMSNorm(xr) * w (+ b) over one row, by the whole block (kNormThreads).
// The row is read once into registers (rows up to kNormCached * kNormThreads long).
constexpr int kNormCached = 16;
__device__ void normRow(int H, const float* xr, const float* w, const float* b, float eps, bool rms, float* shared, __half* out) {
    if (H > kNormCached * kNormThreads) {  // long rows: re-read from global memory
        float sum = 0.f;
        if (!rms)
            for (int j = threadIdx.x; j < H; j += blockDim.x) sum += xr[j];
        const float mean = rms ? 0.f : blockSum(sum, shared) / H;
        float sq = 0.f;
        for (int j = threadIdx.x; j < H; j += blockDim.x) sq += (xr[j] - mean) * (xr[j] - mean);
        const float inv = rsqrtf(blockSum(sq, shared) / H + eps);
        for (int j = threadIdx.x; j < H; j += blockDim.x) out[j] = __float2half((xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.f));
        return;
    }
    float v[kNormCached];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kNormCached; ++i) {
        const int j = threadIdx.x + i * kNormThreads;
        v[i] = j < H ? xr[j] : 0.f;
        sum += v[i];
    }
    const float mean = rms ? 0.f : blockSum(sum, shared) / H;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < kNormCached; ++i)
        if (threadIdx.x + i * kNormThreads < H) sq += (v[i] - mean) * (v[i] - mean);
    const float inv = rsqrtf(blockSum(sq, shared) / H + eps);
#pragma unroll
    for (int i = 0; i < kNormCached; ++i) {
        const int j = threadIdx.x + i * kNormThreads;
        if (j < H) out[j] = __float2half((v[i] - mean) * inv * w[j] + (b ? b[j] : 0.f));
    }
}

__device__ float mlpActivation(int I, const __half* in_row, const __half* bias, bool swiglu, int j) {
    if (swiglu) {
        const float g = __half2float(in_row[j]), u = __half2float(in_row[I + j]);
        return g / (1.f + __expf(-g)) * u;
    }
    const float a = __half2float(in_row[j]) + (bias ? __half2float(bias[j]) : 0.f);
    return 0.5f * a * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)));
}

__global__ void addNormKernel(int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                              float eps, bool rms, __half* out) {
    __shared__ float shared[32];
    const int r = blockIdx.x;
    const int64_t t = row_map ? row_map[r] : r;
    float* xr = x + t * H;
    if (add) {
        for (int j = threadIdx.x; j < H; j += blockDim.x) xr[j] += __half2float(add[t * H + j]) + (add_bias ? __half2float(add_bias[j]) : 0.f);
        __syncthreads();
    }
    normRow(H, xr, w, b, eps, rms, shared, out + int64_t(r) * H);
}

// y[r] = in[r] * W^T for a few rows (R at most): a warp per output column streams W's row
// with 16-byte loads while the block's input rows, made by the prologue (copy, norm or MLP
// activation), sit in shared memory; the epilogue stores f16/f32 or adds into the residual.
template <int R>
__global__ void __launch_bounds__(kNormThreads) smallGemmKernel(int rows, int N, int K, const __half* W, SmallGemmInput in, SmallGemmOutput out) {
    extern __shared__ __align__(16) __half xs[];  // [rows][K]
    __shared__ float shared[32];
    constexpr int U = 8;  // 16-byte weight loads in flight per lane
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, K8 = K / 8;
    const int first = blockIdx.x * warps + warp;
    uint4 wv[U];
    auto load = [&](int n, int k0) {
        const uint4* wrow = reinterpret_cast<const uint4*>(W + int64_t(n) * K);
#pragma unroll
        for (int u = 0; u < U; ++u) wv[u] = k0 + 32 * u < K8 ? __ldg(wrow + k0 + 32 * u) : make_uint4(0, 0, 0, 0);
    };
    if (first < N) load(first, lane);  // the first weights arrive while the prologue runs
    for (int r = 0; r < rows; ++r) {
        __half* dst = xs + int64_t(r) * K;
        if (in.kind == SmallGemmInput::Norm) {
            const int64_t t = in.row_map ? in.row_map[r] : r;
            normRow(K, in.residual + t * K, in.norm_w, in.norm_b, in.eps, in.rms, shared, dst);
        } else if (in.kind == SmallGemmInput::Activation) {
            const __half* row = in.x + int64_t(r) * (in.swiglu ? 2 * K : K);
            for (int j = threadIdx.x; j < K; j += blockDim.x) dst[j] = __float2half(mlpActivation(K, row, in.bias, in.swiglu, j));
        } else {
            for (int j = threadIdx.x; j < K; j += blockDim.x) dst[j] = in.x[int64_t(r) * K + j];
        }
    }
    __syncthreads();
    bool loaded = true;
    for (int n = first; n < N; n += gridDim.x * warps) {
        float acc[R] = {};
        for (int k0 = lane; k0 < K8; k0 += 32 * U) {
            if (!loaded) load(n, k0);
            loaded = false;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = k0 + 32 * u;
                if (k >= K8) break;
                const __half2* w2 = reinterpret_cast<const __half2*>(&wv[u]);
                for (int r = 0; r < R; ++r) {
                    if (r >= rows) break;
                    const uint4 xv = reinterpret_cast<const uint4*>(xs + int64_t(r) * K)[k];
                    const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
                    for (int i = 0; i < 4; ++i) {
                        const float2 wf = __half22float2(w2[i]), xf = __half22float2(x2[i]);
                        acc[r] += wf.x * xf.x + wf.y * xf.y;
                    }
                }
            }
        }
        for (int r = 0; r < R; ++r) acc[r] = warpSum(acc[r]);
        if (lane != 0) continue;
        for (int r = 0; r < rows && r < R; ++r) {
            const int64_t at = int64_t(r) * N + n;
            if (out.kind == SmallGemmOutput::Half) static_cast<__half*>(out.y)[at] = __float2half(acc[r]);
            else if (out.kind == SmallGemmOutput::Float) static_cast<float*>(out.y)[at] = acc[r];
            else static_cast<float*>(out.y)[at] += acc[r] + (out.bias ? __half2float(out.bias[n]) : 0.f);
        }
    }
}

__global__ void qkvToCacheKernel(int heads, const __half* qkv, const __half* bias, StepMeta m, KvLayer kv, bool rope, float theta, __half* q) {
    // One CTA per (token, head of q|k|v); thread i owns the pair (i, i + half).
    const int t = blockIdx.x, h = blockIdx.y, D = kv.head_dim, half = D / 2;
    const int width = (heads + 2 * kv.kv_heads) * D;
    const int pos = m.positions[t], slot = m.slots[t];
    const int64_t block = slot / kv.block_size, offset = slot % kv.block_size;
    const __half* row = qkv + int64_t(t) * width;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const int c0 = h * D + i, c1 = c0 + half;
        float a = __half2float(row[c0]) + (bias ? __half2float(bias[c0]) : 0.f);
        float c = __half2float(row[c1]) + (bias ? __half2float(bias[c1]) : 0.f);
        if (rope && h < heads + kv.kv_heads) {  // q and k heads rotate, v does not
            const float inv_freq = 1.f / powf(theta, float(2 * i) / float(D));
            float sn, cs;
            sincosf(float(pos) * inv_freq, &sn, &cs);
            const float ra = a * cs - c * sn, rc = c * cs + a * sn;
            a = ra, c = rc;
        }
        __half* dst;
        if (h < heads) {
            dst = q + int64_t(t) * heads * D + h * D;
        } else {
            const bool is_k = h < heads + kv.kv_heads;
            const int kh = is_k ? h - heads : h - heads - kv.kv_heads;
            dst = (is_k ? kv.k : kv.v) + ((block * kv.kv_heads + kh) * kv.block_size + offset) * D;
        }
        dst[i] = __float2half(a);
        dst[i + half] = __float2half(c);
    }
}

// One CTA per (query head, token), keys in tiles of kAttentionTile. Each key's dot product
// is shared by D/8 lanes holding 16 bytes of q each, so all of a tile's key (then value)
// loads are independent and in flight together; the tile's scores sit in shared memory
// for its softmax, and an online rescale carries the running max and sum across tiles.
template <int D>
__global__ void __launch_bounds__(kAttentionThreads) pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale, __half* out) {
    constexpr int kLanesPerKey = D / 8, kKeysPerPass = kAttentionThreads / kLanesPerKey;
    __shared__ float score[kAttentionTile];
    __shared__ float reduce[32];
    __shared__ float partial[kKeysPerPass][D + 1];
    const int h = blockIdx.x, t = blockIdx.y;
    const int g = threadIdx.x % kLanesPerKey, key_lane = threadIdx.x / kLanesPerKey;
    const int kh = h / (heads / kv.kv_heads);
    const int len = m.positions[t] + 1;
    const int32_t* table = m.block_tables + int64_t(m.token_chunk[t]) * m.max_blocks;
    float qf[8], acc[8] = {};
    const uint4 qv = *reinterpret_cast<const uint4*>(q + (int64_t(t) * heads + h) * D + g * 8);
    const __half2* qh = reinterpret_cast<const __half2*>(&qv);
    for (int i = 0; i < 4; ++i) qf[2 * i] = __low2float(qh[i]) * scale, qf[2 * i + 1] = __high2float(qh[i]) * scale;
    auto address = [&](int j) { return ((int64_t(table[j / kv.block_size]) * kv.kv_heads + kh) * kv.block_size + j % kv.block_size) * D + g * 8; };
    float run_max = -INFINITY, run_sum = 0.f;
    for (int tile = 0; tile < len; tile += kAttentionTile) {
        const int n = min(kAttentionTile, len - tile);
#pragma unroll 4
        for (int base = 0; base < n; base += kKeysPerPass) {  // uniform trip count: the shuffles need whole warps
            const int jj = base + key_lane;
            uint4 kvec = {};
            if (jj < n) kvec = *reinterpret_cast<const uint4*>(kv.k + address(tile + jj));
            const __half2* k2 = reinterpret_cast<const __half2*>(&kvec);
            float dot = 0.f;
            for (int i = 0; i < 4; ++i) dot += qf[2 * i] * __low2float(k2[i]) + qf[2 * i + 1] * __high2float(k2[i]);
            for (int o = kLanesPerKey / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (g == 0 && jj < n) score[jj] = dot;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += kAttentionThreads) mx = fmaxf(mx, score[i]);
        const float new_max = fmaxf(run_max, blockReduce<kAttentionThreads>(mx, reduce, true));
        float sum = 0.f;
        for (int i = threadIdx.x; i < n; i += kAttentionThreads) {
            const float p = __expf(score[i] - new_max);
            score[i] = p, sum += p;
        }
        sum = blockReduce<kAttentionThreads>(sum, reduce, false);  // its barriers also publish the p values
        const float corr = __expf(run_max - new_max);  // 0 on the first tile
        run_sum = run_sum * corr + sum, run_max = new_max;
        for (int i = 0; i < 8; ++i) acc[i] *= corr;
#pragma unroll 4
        for (int jj = key_lane; jj < n; jj += kKeysPerPass) {
            const float p = score[jj];
            const uint4 vvec = *reinterpret_cast<const uint4*>(kv.v + address(tile + jj));
            const __half2* v2 = reinterpret_cast<const __half2*>(&vvec);
            for (int i = 0; i < 4; ++i) acc[2 * i] += p * __low2float(v2[i]), acc[2 * i + 1] += p * __high2float(v2[i]);
        }
        __syncthreads();  // the next tile overwrites score
    }
    for (int i = 0; i < 8; ++i) partial[key_lane][g * 8 + i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += kAttentionThreads) {
        float o = 0.f;
        for (int k = 0; k < kKeysPerPass; ++k) o += partial[k][d];
        out[(int64_t(t) * heads + h) * D + d] = __float2half(o / run_sum);
    }
}

__global__ void mlpActivationKernel(int I, const __half* in, const __half* bias, bool swiglu, __half* out) {
    const int t = blockIdx.y;
    const __half* row = in + int64_t(t) * (swiglu ? 2 * I : I);
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += gridDim.x * blockDim.x)
        out[int64_t(t) * I + j] = __float2half(mlpActivation(I, row, bias, swiglu, j));
}

template <int R>
void launchSmallGemmRows(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int max_blocks, cudaStream_t s) {
    const int warps = kNormThreads / 32;
    const int blocks = std::min((N + warps - 1) / warps, max_blocks);
    smallGemmKernel<R><<<blocks, kNormThreads, size_t(rows) * K * 2, s>>>(rows, N, K, W, in, out);
}

}  // namespace

void launchEmbed(int T, int H, const StepMeta& m, const __half* wte, const __half* wpe, float* x, cudaStream_t s) {
    embedKernel<<<T, 256, 0, s>>>(H, m, wte, wpe, x);
}

void launchAddNorm(int rows, int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                   float eps, bool rms, __half* out, cudaStream_t s) {
    addNormKernel<<<rows, kNormThreads, 0, s>>>(H, row_map, x, add, add_bias, w, b, eps, rms, out);
}

void launchQkvToCache(int T, int heads, const __half* qkv, const __half* bias, const StepMeta& m, const KvLayer& kv, bool rope, float theta,
                      __half* q, cudaStream_t s) {
    qkvToCacheKernel<<<dim3(T, heads + 2 * kv.kv_heads), kv.head_dim / 2, 0, s>>>(heads, qkv, bias, m, kv, rope, theta, q);
}

void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, __half* out, cudaStream_t s) {
    const dim3 grid(heads, T);
    if (kv.head_dim == 64) pagedAttentionKernel<64><<<grid, kAttentionThreads, 0, s>>>(heads, q, m, kv, scale, out);
    else pagedAttentionKernel<128><<<grid, kAttentionThreads, 0, s>>>(heads, q, m, kv, scale, out);
}

bool prepareSmallGemm(int max_k) {
    const int bytes = kSmallGemmMaxRows * max_k * 2;
    int device = 0, optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return false;
    if (bytes + 1024 > optin) return false;
    return cudaFuncSetAttribute(smallGemmKernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
           cudaFuncSetAttribute(smallGemmKernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
           cudaFuncSetAttribute(smallGemmKernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

void launchSmallGemm(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int max_blocks, cudaStream_t s) {
    if (rows == 1) launchSmallGemmRows<1>(rows, N, K, W, in, out, max_blocks, s);
    else if (rows == 2) launchSmallGemmRows<2>(rows, N, K, W, in, out, max_blocks, s);
    else launchSmallGemmRows<4>(rows, N, K, W, in, out, max_blocks, s);
}

void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s) {
    const dim3 grid((I + 255) / 256, T);
    mlpActivationKernel<<<grid, 256, 0, s>>>(I, in, bias, swiglu, out);
}

}  // namespace kiln::llm::cuda
