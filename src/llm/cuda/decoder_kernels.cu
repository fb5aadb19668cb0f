#include "llm/cuda/decoder_kernels.h"

#include <math.h>

#include <algorithm>
#include <type_traits>

#include "llm/cuda/argmax_key.h"
#include "llm/cuda/decoder_device.cuh"
#include "llm/cuda/small_gemm_plan.h"

namespace kiln::llm::cuda {

namespace {

__device__ float blockSum(float v, float* shared) { return blockReduce<kBlockThreads>(v, shared, false); }

__global__ void embedKernel(int H, StepMeta m, const __half* wte, const __half* wpe, float* x) {
    CtaTrace trace(kCtaEmbed, H, 0);
    const int t = blockIdx.x;
    const int64_t tok = m.tokens[t], pos = m.positions[t];
    for (int j = threadIdx.x; j < H; j += blockDim.x)
        x[int64_t(t) * H + j] = __half2float(wte[tok * H + j]) + (wpe ? __half2float(wpe[pos * H + j]) : 0.f);
}

// out = LayerNorm/RMSNorm(xr) * w (+ b) over one row, by the whole block (kBlockThreads).
// The row is read once into registers (rows up to kNormCached * kBlockThreads long).
constexpr int kNormCached = 16;
__device__ void normRow(int H, const float* xr, const float* w, const float* b, float eps, bool rms, float* shared, __half* out) {
    if (H > kNormCached * kBlockThreads) {  // long rows: re-read from global memory
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
        const int j = threadIdx.x + i * kBlockThreads;
        v[i] = j < H ? xr[j] : 0.f;
        sum += v[i];
    }
    const float mean = rms ? 0.f : blockSum(sum, shared) / H;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < kNormCached; ++i)
        if (threadIdx.x + i * kBlockThreads < H) sq += (v[i] - mean) * (v[i] - mean);
    const float inv = rsqrtf(blockSum(sq, shared) / H + eps);
#pragma unroll
    for (int i = 0; i < kNormCached; ++i) {
        const int j = threadIdx.x + i * kBlockThreads;
        if (j < H) out[j] = __float2half((v[i] - mean) * inv * w[j] + (b ? b[j] : 0.f));
    }
}

__device__ __forceinline__ float geluTanh(float a) { return 0.5f * a * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))); }
__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

// One (token, head, pair i) of q|k|v: a = row h*D + i, c = row h*D + i + D/2, bias added,
// rotated (q and k heads, Llama) by the token's position, stored to q or the cache slot.
__device__ void storeQkvPair(const QkvDestination& d, int t, int position, int slot, int h, int i, float a, float c) {
    const int D = d.kv.head_dim, half = D / 2;
    if (d.bias) a += __half2float(d.bias[h * D + i]), c += __half2float(d.bias[h * D + i + half]);
    if (d.rope && h < d.heads + d.kv.kv_heads) {  // q and k heads rotate, v does not
        const float inv_freq = 1.f / powf(d.theta, float(2 * i) / float(D));
        float sn, cs;
        sincosf(float(position) * inv_freq, &sn, &cs);
        const float ra = a * cs - c * sn, rc = c * cs + a * sn;
        a = ra, c = rc;
    }
    __half* dst;
    if (h < d.heads) {
        dst = d.q + (int64_t(t) * d.heads + h) * D;
    } else {
        const int64_t block = slot / d.kv.block_size, offset = slot % d.kv.block_size;
        const bool is_k = h < d.heads + d.kv.kv_heads;
        const int kh = is_k ? h - d.heads : h - d.heads - d.kv.kv_heads;
        dst = (is_k ? d.kv.k : d.kv.v) + ((block * d.kv.kv_heads + kh) * d.kv.block_size + offset) * D;
    }
    dst[i] = __float2half(a);
    dst[i + half] = __float2half(c);
}

__global__ void addNormKernel(int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                              float eps, bool rms, __half* out) {
    CtaTrace trace(kCtaAddNorm, H, 0);
    waitForPredecessor(trace);
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

// 16 bytes of weights, read once per step: with `evict_first` marked first out of L2 (and
// kept out of L1), so that streaming the weights does not push out what the step reuses
// (the KV cache of earlier tokens, activations).
__device__ __forceinline__ uint4 loadWeights(const uint4* p, bool evict_first, uint64_t policy) {
    if (!evict_first) return __ldg(p);
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
    return v;
}

// Copies n floats to shared memory asynchronously (cp.async; the caller waits with
// cp.async.wait_all), 16 bytes at a time where both sides allow it.
__device__ __forceinline__ void copyToShared(float* dst, const float* src, int n) {
    const bool wide = n % 4 == 0 && (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0;
    const int step = wide ? 4 : 1;
    for (int j = threadIdx.x * step; j < n; j += blockDim.x * step) {
        const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + j));
        if (wide) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(src + j) : "memory");
        else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(to), "l"(src + j) : "memory");
    }
}

// Dynamic shared memory of a small GEMM: the input rows (f16), then a norm's weight and
// bias when there are (norm_vectors 1 or 2, f32).
inline size_t smallGemmSmem(int rows, int K, int norm_vectors) { return size_t(rows) * K * 2 + size_t(norm_vectors) * K * 4; }
inline int normVectors(const SmallGemmInput& in) { return in.kind == SmallGemmInput::Norm ? (in.norm_b ? 2 : 1) : 0; }

// y[r] = in[r] * W^T for a few rows (R at most): a warp per task of P adjacent output rows
// (P = 2 for the interleaved pairs) streams those weight rows in chunks of 16-byte loads,
// two chunks in flight (double-buffered registers; the first two issued before waiting for
// the previous kernel); the block's input rows, made by the prologue (copy or norm), sit in
// shared memory; the epilogue stores or fuses per kind.
// kHalf: 0, f32 products; 1, each 16-byte piece's 8 products made and summed in f16, four
// per half of a half2 (one multiply, three fused multiply-adds), then the two sums added in
// f32: about half the instructions of f32 products, and instruction issue bounds these
// kernels as much as HBM does (bench/gemv_stream_bench.cu); 2, two pieces' 16 products in one
// f16 sum (eight per half), which halves the conversions and f32 adds again; 3, a chunk's
// pieces (16 or 32 products per half). Products of a norm's (or activation's) output and a
// weight stay far inside f16's range.
template <int R, int P, int kHalf>
__global__ void __launch_bounds__(kBlockThreads) smallGemmKernel(int rows, int N, int K, const __half* W, SmallGemmInput in, SmallGemmOutput out,
                                                                  bool evict_first, bool red_add) {
    CtaTrace trace(kCtaSmallGemm, N, K);
    extern __shared__ __align__(16) __half xs[];  // [rows][K]
    __shared__ float shared[32];
    constexpr int U = 8 / P;  // 16-byte weight loads per lane and row in one chunk
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, K8 = K / 8, tasks = (N + P - 1) / P;
    const int chunks = smallGemmChunks(K, P), stride = gridDim.x * warps;
    uint64_t policy = 0;
    if (evict_first) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    auto load = [&](uint4(&w)[P][U], int task, int chunk) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int n = task * P + p;  // past N (an odd N's last pair): zeros
            const uint4* wrow = reinterpret_cast<const uint4*>(W + int64_t(n) * K);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (chunk * U + u) * 32 + lane;
                w[p][u] = k < K8 && n < N ? loadWeights(wrow + k, evict_first, policy) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    // This warp's chunks in order: (task, chunk) in buffer a, the one after in buffer b.
    auto advance = [&](int& task, int& chunk) {
        if (++chunk == chunks) chunk = 0, task += stride;
    };
    uint4 wa[P][U], wb[P][U];
    int task = blockIdx.x * warps + warp, chunk = 0, next_task = task, next_chunk = 0;
    advance(next_task, next_chunk);
    if (task < tasks) load(wa, task, chunk);  // weights do not depend on the previous kernel
    if (next_task < tasks) load(wb, next_task, next_chunk);
    // Nor do the norm's weights (copied to shared memory without passing through registers)
    // or the step's metadata (uploaded before the step's first kernel): their trips to
    // memory overlap the previous kernel instead of following it.
    const bool norm = in.kind == SmallGemmInput::Norm;
    float* norm_w = reinterpret_cast<float*>(xs + int64_t(rows) * K);
    float* norm_b = in.norm_b ? norm_w + K : nullptr;
    if (norm) {
        copyToShared(norm_w, in.norm_w, K);
        if (norm_b) copyToShared(norm_b, in.norm_b, K);
    }
    int token_row[R];
#pragma unroll
    for (int r = 0; r < R; ++r) token_row[r] = r < rows && in.row_map ? in.row_map[r] : r;
    const bool qkv = out.kind == SmallGemmOutput::Qkv && lane < rows;
    const int qkv_position = qkv ? out.qkv.meta.positions[lane] : 0, qkv_slot = qkv ? out.qkv.meta.slots[lane] : 0;
    waitForPredecessor(trace);
    if (norm) asm volatile("cp.async.wait_all;" ::: "memory");  // normRow reads them after a barrier
    for (int r = 0; r < rows; ++r) {
        __half* dst = xs + int64_t(r) * K;
        if (norm) {
            normRow(K, in.residual + int64_t(token_row[r]) * K, norm_w, norm_b, in.eps, in.rms, shared, dst);
        } else {
            const uint4* src = reinterpret_cast<const uint4*>(in.x + int64_t(r) * K);
            for (int j = threadIdx.x; j < K8; j += blockDim.x) reinterpret_cast<uint4*>(dst)[j] = src[j];
        }
    }
    __syncthreads();
    float acc[P][R] = {};
    unsigned long long best = 0;  // Float with argmax keys: lane r's best key of row r so far
    auto epilogue = [&] {
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[p][r] = warpSum(acc[p][r]);
        float a0 = 0.f, a1 = 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r == lane) a0 = acc[0][r], a1 = acc[P - 1][r];
            for (int p = 0; p < P; ++p) acc[p][r] = 0.f;
        }
        if (lane >= rows || lane >= R) return;  // lane r stores token row r
        const int r = lane;
        // Row n of the output, for the kinds with one output per weight row.
        auto store = [&](int n, float a) {
            const int64_t at = int64_t(r) * N + n;
            const float bias = out.bias ? __half2float(out.bias[n]) : 0.f;
            if (out.kind == SmallGemmOutput::Half) static_cast<__half*>(out.y)[at] = __float2half(a);
            else if (out.kind == SmallGemmOutput::Float) {
                static_cast<float*>(out.y)[at] = a;
                if (out.argmax_keys && !isnan(a)) best = max(best, argmaxKey(a, n));
            }
            else if (out.kind == SmallGemmOutput::GeluBias) static_cast<__half*>(out.y)[at] = __float2half(geluTanh(a + bias));
            else if (red_add) atomicAdd(static_cast<float*>(out.y) + at, a + bias);  // one adder per element: deterministic
            else static_cast<float*>(out.y)[at] += a + bias;
        };
        if constexpr (P == 2) {
            if (out.kind == SmallGemmOutput::SwiGlu) {
                static_cast<__half*>(out.y)[int64_t(r) * tasks + task] = __float2half(silu(a0) * a1);
            } else if (out.kind == SmallGemmOutput::Qkv) {  // task = head * D/2 + i
                const int half = out.qkv.kv.head_dim / 2;
                storeQkvPair(out.qkv, r, qkv_position, qkv_slot, task / half, task % half, a0, a1);
            } else {  // a pair of plain rows (short rows: rowPairs)
                store(2 * task, a0);
                if (2 * task + 1 < N) store(2 * task + 1, a1);
            }
        } else {
            store(task, a0);
        }
    };
    // Multiplies the chunk in w, ends the task after its last chunk, then refills w with the
    // chunk after the one in flight in the other buffer.
    auto step = [&](uint4(&w)[P][U]) {
        if constexpr (kHalf == 0) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (chunk * U + u) * 32 + lane;
                if (k >= K8) break;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r >= rows) break;
                    const uint4 xv = reinterpret_cast<const uint4*>(xs + int64_t(r) * K)[k];
                    const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        const __half2* w2 = reinterpret_cast<const __half2*>(&w[p][u]);
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            const float2 wf = __half22float2(w2[i]), xf = __half22float2(x2[i]);
                            acc[p][r] += wf.x * xf.x + wf.y * xf.y;
                        }
                    }
                }
            }
        } else {
            constexpr int kPieces = kHalf == 1 ? 1 : kHalf == 2 ? 2 : U;  // 16-byte pieces per f16 sum (U is even)
#pragma unroll
            for (int u = 0; u < U; u += kPieces) {
                const int k0 = (chunk * U + u) * 32 + lane;
                if (k0 >= K8) break;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r >= rows) break;
                    __half2 sum[P];
#pragma unroll
                    for (int j = 0; j < kPieces; ++j) {
                        const int k = k0 + 32 * j;  // past K: x and the weights are zeros
                        const uint4 xv = j == 0 || k < K8 ? reinterpret_cast<const uint4*>(xs + int64_t(r) * K)[k] : make_uint4(0, 0, 0, 0);
                        const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
                        for (int p = 0; p < P; ++p) {
                            const __half2* w2 = reinterpret_cast<const __half2*>(&w[p][u + j]);
                            sum[p] = j == 0 ? __hmul2(w2[0], x2[0]) : __hfma2(w2[0], x2[0], sum[p]);
#pragma unroll
                            for (int i = 1; i < 4; ++i) sum[p] = __hfma2(w2[i], x2[i], sum[p]);
                        }
                    }
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        const float2 f = __half22float2(sum[p]);
                        acc[p][r] += f.x + f.y;
                    }
                }
            }
        }
        if (chunk == chunks - 1) epilogue();
        int after_task = next_task, after_chunk = next_chunk;
        advance(after_task, after_chunk);
        if (after_task < tasks) load(w, after_task, after_chunk);
        task = next_task, chunk = next_chunk, next_task = after_task, next_chunk = after_chunk;
    };
    while (task < tasks) {
        step(wa);
        if (task >= tasks) break;
        step(wb);
    }
    if (out.argmax_keys) {  // the block's best per row, then one atomic per block and row
        __shared__ unsigned long long block_best[kBlockThreads / 32][R];
        if (lane < R) block_best[warp][lane] = best;
        __syncthreads();
        if (threadIdx.x < rows && threadIdx.x < R) {
            unsigned long long b = 0;
            for (int w = 0; w < warps; ++w) b = max(b, block_best[w][threadIdx.x]);
            if (b) atomicMax(out.argmax_keys + threadIdx.x, b);
        }
    }
}

__global__ void qkvToCacheKernel(const __half* qkv, QkvDestination d) {
    CtaTrace trace(kCtaQkvToCache, d.heads, 0);
    waitForPredecessor(trace);
    // One CTA per (token, head of q|k|v); thread i owns the pair (i, i + half), stored at
    // columns h*D + 2i and h*D + 2i + 1 of the interleaved row.
    const int t = blockIdx.x, h = blockIdx.y, D = d.kv.head_dim, half = D / 2;
    const int width = (d.heads + 2 * d.kv.kv_heads) * D;
    const __half* row = qkv + int64_t(t) * width + h * D;
    const int position = d.meta.positions[t], slot = d.meta.slots[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) storeQkvPair(d, t, position, slot, h, i, __half2float(row[2 * i]), __half2float(row[2 * i + 1]));
}

__global__ void mlpActivationKernel(int I, const __half* in, const __half* bias, bool swiglu, __half* out) {
    CtaTrace trace(kCtaMlpActivation, I, 0);
    waitForPredecessor(trace);
    const int t = blockIdx.y;
    const __half* row = in + int64_t(t) * (swiglu ? 2 * I : I);
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += gridDim.x * blockDim.x) {
        const float v = swiglu ? silu(__half2float(row[2 * j])) * __half2float(row[2 * j + 1])
                               : geluTanh(__half2float(row[j]) + (bias ? __half2float(bias[j]) : 0.f));
        out[int64_t(t) * I + j] = __float2half(v);
    }
}

__global__ void argmaxKernel(int n, const float* x, int32_t* ids) {
    CtaTrace trace(kCtaArgmax, n, 0);
    waitForPredecessor(trace);
    __shared__ float best_value[32];
    __shared__ int best_index[32];
    const float* values = x + int64_t(blockIdx.x) * n;
    float v = -INFINITY;
    int at = n;  // no candidate yet
    // Each thread sees its values in increasing index order and keeps the first maximum.
    auto consider = [&](float value, int j) {
        if (value > v || (at == n && value == v)) v = value, at = j;
    };
    // Four float4 loads in flight per thread (one float at a time left a 1024-thread block
    // latency-bound: 13-18 us for a 32K-50K vocabulary on the H200); rows need not be
    // 16-byte aligned (GPT-2's 50,257), so a scalar head and tail go around the body.
    const int head = min(n, int((16 - (reinterpret_cast<uintptr_t>(values) & 15)) % 16 / 4));
    for (int j = threadIdx.x; j < head; j += blockDim.x) consider(values[j], j);
    const float4* body = reinterpret_cast<const float4*>(values + head);
    const int quads = (n - head) / 4;
    constexpr int kInFlight = 4;
    for (int q0 = threadIdx.x; q0 < quads; q0 += kInFlight * blockDim.x) {
        float4 f[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u)
            if (q0 + u * int(blockDim.x) < quads) f[u] = body[q0 + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
            const int qi = q0 + u * blockDim.x, j = head + 4 * qi;
            if (qi >= quads) break;
            consider(f[u].x, j), consider(f[u].y, j + 1), consider(f[u].z, j + 2), consider(f[u].w, j + 3);
        }
    }
    for (int j = head + 4 * quads + threadIdx.x; j < n; j += blockDim.x) consider(values[j], j);
    // (v, at) becomes the warp's best: the larger value, the lower index on ties.
    auto warpBest = [&] {
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, at, o);
            if (ov > v || (ov == v && oi < at)) v = ov, at = oi;
        }
    };
    warpBest();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) best_value[warp] = v, best_index[warp] = at;
    __syncthreads();
    if (warp > 0) return;
    v = lane < int(blockDim.x / 32) ? best_value[lane] : -INFINITY, at = lane < int(blockDim.x / 32) ? best_index[lane] : n;
    warpBest();
    if (lane == 0) ids[blockIdx.x] = at < n ? at : 0;  // all NaN: id 0
}

// A resident wave of blocks: as many as fit on each SM at this shared-memory size, or
// fewer (llm.cuda.gemv_ctas_per_sm, for A/B runs: one per SM was 20% slower on the H200;
// building for three per SM, fewer registers, gained nothing); the warps stride over the tasks.
// Leaving room: only half the wave runs when the weights all fit in the loads that half
// issues before its wait, so that the next kernel's CTAs find room and start their own
// weight loads while this one computes: where they fit in one chunk per warp, or in two when
// the next kernel streams at least twice these weights (the o projection before gate|up:
// Llama-1.1B on the H200 0.766 -> 0.743 ms/token; the loads were in flight anyway, during
// attention). GPT-2's fc and down in half a wave (two chunks per warp, next kernels no
// larger): 0.231-0.238 ms/token against 0.223-0.231 with one chunk per warp only.
// llm.cuda.gemv_leave_room: 0 off, 1 two chunks per warp whatever comes next, 2 one chunk.
// (small_gemm_plan.h, leaveRoomFits.)
template <int R, int P, int kHalf>
void launchSmallGemmRows(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int64_t next_weights,
                         int sms, cudaStream_t s) {
    const int cap = stepKnobs().gemv_ctas_per_sm;
    // Evict-first weight loads: batch-1 decode on the H200 0.340 -> 0.309 ms/token (GPT-2),
    // 0.943 -> 0.914 (Llama-1.1B). llm.cuda.weights_evict_first=off turns them off.
    const bool evict_first = stepKnobs().weights_evict_first;
    // Residual adds as reductions in L2 (red.global.add, nothing returned): a warp does not
    // wait a trip to memory for the old value before its next task, or before its CTA can
    // leave to the next kernel. llm.cuda.gemv_red_add=off loads and stores instead.
    const bool red_add = stepKnobs().gemv_red_add;
    const int warps = kBlockThreads / 32, tasks = (N + P - 1) / P;
    const size_t smem = smallGemmSmem(rows, K, normVectors(in));
    int per_sm = 1;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, smallGemmKernel<R, P, kHalf>, kBlockThreads, smem);
    per_sm = std::max(per_sm, 1);
    if (cap > 0) per_sm = std::min(per_sm, cap);
    const int chunks = smallGemmChunks(K, P);
    const int room = stepKnobs().gemv_leave_room;
    if (per_sm >= 2 && leaveRoomFits(int64_t(tasks) * chunks, int64_t(warps) * (per_sm / 2) * sms, int64_t(N) * K * 2, next_weights, room))
        per_sm /= 2;
    const int blocks = std::min((tasks + warps - 1) / warps, per_sm * sms);
    launchDependent(smallGemmKernel<R, P, kHalf>, dim3(blocks), dim3(kBlockThreads), smem, s, rows, N, K, W, in, out, evict_first, red_add);
}

template <int P, int kHalf>
void launchSmallGemmPairs(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int64_t next_weights, int sms,
                          cudaStream_t s) {
    if (rows == 1) launchSmallGemmRows<1, P, kHalf>(rows, N, K, W, in, out, next_weights, sms, s);
    else if (rows == 2) launchSmallGemmRows<2, P, kHalf>(rows, N, K, W, in, out, next_weights, sms, s);
    else launchSmallGemmRows<4, P, kHalf>(rows, N, K, W, in, out, next_weights, sms, s);
}

// f(std::integral_constant<int, half>{}) for smallGemmKernel's kHalf = half (0-3).
constexpr int kHalfProductModes = 4;
template <typename F>
auto withHalfProducts(int half, F&& f) {
    if (half == 0) return f(std::integral_constant<int, 0>{});
    if (half == 1) return f(std::integral_constant<int, 1>{});
    if (half == 2) return f(std::integral_constant<int, 2>{});
    return f(std::integral_constant<int, 3>{});
}

template <int P>
bool allowSmallGemmSmem(int bytes) {
    auto allow = [&](auto kernel) { return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess; };
    bool ok = true;
    for (int half = 0; half < kHalfProductModes; ++half)
        ok = ok && withHalfProducts(half, [&](auto h) {
                 constexpr int kHalf = decltype(h)::value;
                 return allow(smallGemmKernel<1, P, kHalf>) && allow(smallGemmKernel<2, P, kHalf>) && allow(smallGemmKernel<4, P, kHalf>);
             });
    return ok;
}

}  // namespace

void setTraceSink(CtaTraceRecord* records, unsigned* used, unsigned capacity) {
    const TraceSink sink{records, used, capacity};
    cudaMemcpyToSymbol(g_trace_sink, &sink, sizeof sink);
    setAttentionTraceSink(sink);
}

namespace {
thread_local const DecoderKnobs* t_step_knobs = nullptr;
}  // namespace

const DecoderKnobs& stepKnobs() {
    static const DecoderKnobs defaults;
    return t_step_knobs ? *t_step_knobs : defaults;
}

StepKnobs::StepKnobs(const DecoderKnobs& knobs) : previous_(t_step_knobs) { t_step_knobs = &knobs; }
StepKnobs::~StepKnobs() { t_step_knobs = previous_; }

bool programmaticLaunchEnabled() {
    static const bool supported = [] {
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
        return major >= 9;
    }();
    return supported && stepKnobs().pdl;
}

void launchEmbed(int T, int H, const StepMeta& m, const __half* wte, const __half* wpe, float* x, cudaStream_t s) {
    embedKernel<<<T, 256, 0, s>>>(H, m, wte, wpe, x);  // after the metadata copy: launched normally
}

void launchAddNorm(int rows, int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                   float eps, bool rms, __half* out, cudaStream_t s) {
    launchDependent(addNormKernel, dim3(rows), dim3(kBlockThreads), 0, s, H, row_map, x, add, add_bias, w, b, eps, rms, out);
}

void launchQkvToCache(int T, const __half* qkv, const QkvDestination& d, cudaStream_t s) {
    launchDependent(qkvToCacheKernel, dim3(T, d.heads + 2 * d.kv.kv_heads), dim3(d.kv.head_dim / 2), 0, s, qkv, d);
}

bool prepareSmallGemm(int max_k, int norm_k) {
    const int bytes = static_cast<int>(std::max(smallGemmSmem(kSmallGemmMaxRows, max_k, 0), smallGemmSmem(kSmallGemmMaxRows, norm_k, 2)));
    int device = 0, optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return false;
    if (bytes + 1024 > optin) return false;
    return allowSmallGemmSmem<1>(bytes) && allowSmallGemmSmem<2>(bytes);
}

// Short rows go in pairs when single rows would leave warps with more than one task: a
// warp's loads then cover more of its chunk, and the tasks spread evenly. With K = 768
// (GPT-2), 96 16-byte pieces a row, one row per task uses 3 of each lane's 8 loads, two rows
// 6 of 4 + 4. On the H200 (GPT-2, per token): the LM head 27.0 -> 21.1 us, fc (3072 rows)
// 4.9 -> 4.3-4.9 us a layer; but the output projection and down (768 rows, one task per warp
// either way) 2.1 -> 2.6 and 3.1 -> 4.2 us, so those keep single rows. Rows of a multiple of
// 256 pieces (Llama-1.1B's 2048) gain nothing. llm.cuda.gemv_row_pairs=off keeps single rows.
// (The wave: two CTAs per SM, as the small GEMM's registers allow.)
static bool rowPairs(int N, int K, int sms) {
    const bool allowed = stepKnobs().gemv_row_pairs;
    return allowed && rowPairsPay(N, K, int64_t(2) * sms * (kBlockThreads / 32));
}

void launchSmallGemm(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int64_t next_weights, int sms,
                     cudaStream_t s) {
    // f16 products, 16 per f16 sum, by default (smallGemmKernel's kHalf = 2): H200, batch-1
    // Llama-1.1B, 2 interleaved rounds, 0.742-0.749 ms/token against 0.758-0.775 with 8 per
    // sum and 0.745-0.754 with a chunk's (GPT-2 within noise). llm.cuda.gemv_half_products
    // picks another: 0 f32 products, 1 eight per f16 sum, 3 a chunk's.
    const int half = std::clamp(stepKnobs().gemv_half_products, 0, kHalfProductModes - 1);
    const bool pairs = out.kind == SmallGemmOutput::SwiGlu || out.kind == SmallGemmOutput::Qkv || rowPairs(N, K, sms);
    withHalfProducts(half, [&](auto h) {
        constexpr int kHalf = decltype(h)::value;
        pairs ? launchSmallGemmPairs<2, kHalf>(rows, N, K, W, in, out, next_weights, sms, s)
              : launchSmallGemmPairs<1, kHalf>(rows, N, K, W, in, out, next_weights, sms, s);
    });
}

void launchArgmax(int rows, int n, const float* x, int32_t* ids, cudaStream_t s) {
    launchDependent(argmaxKernel, dim3(rows), dim3(1024), 0, s, n, x, ids);
}

void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s) {
    launchDependent(mlpActivationKernel, dim3((I + 255) / 256, T), dim3(256), 0, s, I, in, bias, swiglu, out);
}

}  // namespace kiln::llm::cuda
