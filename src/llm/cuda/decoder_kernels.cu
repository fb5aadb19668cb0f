#include "llm/cuda/decoder_kernels.h"

#include <math.h>

namespace kiln::llm::cuda {

namespace {

constexpr int kNormThreads = 256;
constexpr int kAttentionWarps = 4;

__device__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block (kNormThreads threads); every thread gets the result.
__device__ float blockSum(float v, float* shared) {
    v = warpSum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // shared may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = lane < kNormThreads / 32 ? shared[lane] : 0.f;
    return warpSum(t);
}

__global__ void embedKernel(int H, StepMeta m, const __half* wte, const __half* wpe, float* x) {
    const int t = blockIdx.x;
    const int64_t tok = m.tokens[t], pos = m.positions[t];
    for (int j = threadIdx.x; j < H; j += blockDim.x)
        x[int64_t(t) * H + j] = __half2float(wte[tok * H + j]) + (wpe ? __half2float(wpe[pos * H + j]) : 0.f);
}

__global__ void addNormKernel(int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                              float eps, bool rms, __half* out) {
    __shared__ float shared[32];
    const int r = blockIdx.x;
    const int64_t t = row_map ? row_map[r] : r;
    float* xr = x + t * H;
    float sum = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
        float v = xr[j];
        if (add) v += __half2float(add[t * H + j]) + (add_bias ? __half2float(add_bias[j]) : 0.f), xr[j] = v;
        sum += v;
    }
    const float mean = rms ? 0.f : blockSum(sum, shared) / H;
    float sq = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) sq += (xr[j] - mean) * (xr[j] - mean);
    const float inv = rsqrtf(blockSum(sq, shared) / H + eps);
    for (int j = threadIdx.x; j < H; j += blockDim.x) out[int64_t(r) * H + j] = __float2half((xr[j] - mean) * inv * w[j] + (b ? b[j] : 0.f));
}

__global__ void qkvToCacheKernel(int heads, const __half* qkv, const __half* bias, StepMeta m, KvLayer kv, bool rope, float theta, __half* q) {
    const int t = blockIdx.x, D = kv.head_dim, half = D / 2;
    const int all = heads + 2 * kv.kv_heads, width = all * D;
    const int pos = m.positions[t], slot = m.slots[t];
    const int64_t block = slot / kv.block_size, offset = slot % kv.block_size;
    const __half* row = qkv + int64_t(t) * width;
    for (int e = threadIdx.x; e < all * half; e += blockDim.x) {
        const int h = e / half, i = e % half;  // head of q|k|v, pair (i, i + half)
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

// One CTA per (head, token); each warp walks every kAttentionWarps-th key with an online
// softmax, lanes owning VEC consecutive dims; the warps' partial results merge at the end.
template <int VEC>
__global__ void pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale, __half* out) {
    constexpr int D = VEC * 32;
    const int h = blockIdx.x, t = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kh = h / (heads / kv.kv_heads);
    const int len = m.positions[t] + 1;
    const int32_t* table = m.block_tables + int64_t(m.token_chunk[t]) * m.max_blocks;
    float qv[VEC], acc[VEC];
    const __half* qh = q + (int64_t(t) * heads + h) * D + lane * VEC;
    for (int i = 0; i < VEC; ++i) qv[i] = __half2float(qh[i]) * scale, acc[i] = 0.f;
    float mx = -INFINITY, l = 0.f;
    for (int j = warp; j < len; j += kAttentionWarps) {
        const int64_t base = ((int64_t(table[j / kv.block_size]) * kv.kv_heads + kh) * kv.block_size + j % kv.block_size) * D + lane * VEC;
        float dot = 0.f;
        for (int i = 0; i < VEC; ++i) dot += qv[i] * __half2float(kv.k[base + i]);
        const float s = warpSum(dot);
        const float nm = fmaxf(mx, s), corr = __expf(mx - nm), p = __expf(s - nm);
        l = l * corr + p;
        for (int i = 0; i < VEC; ++i) acc[i] = acc[i] * corr + p * __half2float(kv.v[base + i]);
        mx = nm;
    }
    __shared__ float s_m[kAttentionWarps], s_l[kAttentionWarps], s_acc[kAttentionWarps][D];
    if (lane == 0) s_m[warp] = mx, s_l[warp] = l;
    for (int i = 0; i < VEC; ++i) s_acc[warp][lane * VEC + i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float gm = -INFINITY;
    for (int w = 0; w < kAttentionWarps; ++w) gm = fmaxf(gm, s_m[w]);
    float total = 0.f, o[VEC] = {};
    for (int w = 0; w < kAttentionWarps; ++w) {
        if (s_m[w] == -INFINITY) continue;  // a warp that saw no key
        const float f = __expf(s_m[w] - gm);
        total += s_l[w] * f;
        for (int i = 0; i < VEC; ++i) o[i] += s_acc[w][lane * VEC + i] * f;
    }
    __half* oh = out + (int64_t(t) * heads + h) * D + lane * VEC;
    for (int i = 0; i < VEC; ++i) oh[i] = __float2half(o[i] / total);
}

__global__ void mlpActivationKernel(int I, const __half* in, const __half* bias, bool swiglu, __half* out) {
    const int t = blockIdx.y;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += gridDim.x * blockDim.x) {
        float v;
        if (swiglu) {
            const float g = __half2float(in[int64_t(t) * 2 * I + j]), u = __half2float(in[int64_t(t) * 2 * I + I + j]);
            v = g / (1.f + __expf(-g)) * u;
        } else {
            const float a = __half2float(in[int64_t(t) * I + j]) + (bias ? __half2float(bias[j]) : 0.f);
            v = 0.5f * a * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)));
        }
        out[int64_t(t) * I + j] = __float2half(v);
    }
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
    qkvToCacheKernel<<<T, 128, 0, s>>>(heads, qkv, bias, m, kv, rope, theta, q);
}

void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, __half* out, cudaStream_t s) {
    const dim3 grid(heads, T);
    if (kv.head_dim == 64) pagedAttentionKernel<2><<<grid, 32 * kAttentionWarps, 0, s>>>(heads, q, m, kv, scale, out);
    else pagedAttentionKernel<4><<<grid, 32 * kAttentionWarps, 0, s>>>(heads, q, m, kv, scale, out);
}

void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s) {
    const dim3 grid((I + 255) / 256, T);
    mlpActivationKernel<<<grid, 256, 0, s>>>(I, in, bias, swiglu, out);
}

}  // namespace kiln::llm::cuda
