// Can batch-1 decode of a small model come within 1.5x of the HBM bandwidth limit on this GPU?
// A feasibility benchmark for one design, standalone (random fp16 weights of the GPT-2-small
// and Llama-1.1B shapes): a token's whole forward pass as one persistent kernel, one CTA per SM.
//
// Why this design: in Kiln's decoder every dependent step (a kernel, or a phase of the layers
// kernel) streams its own weights only after its wait, so each of a layer's five steps pays a
// DRAM round trip plus the synchronisation (bench/results/2026-12-04-*). Here each CTA's
// producer warp streams the CTA's fixed slice of every weight matrix, in the order they are
// used, through a ring of shared-memory slots with the copy engine (cp.async.bulk + mbarrier),
// never waiting on a dependency: only on a free slot. The eight consumer warps wait on per-step
// counters (a grid barrier per step), read the step's input from L2 and multiply it by rows
// already on chip. Steps per layer: q|k|v (norm fused), attention (split over positions),
// output projection += residual, fc or gate|up (norm fused, GELU or SwiGLU), down += residual;
// then the LM head with an argmax per CTA and a last step that combines them. Each row of a
// GEMV belongs to one CTA, so the residual adds are plain and the results deterministic.
//
// Checked against a chain of naive kernels (f32 throughout) on the same data: the residual
// stream after the last layer and the argmax token. Reported: ms/token (events over many
// tokens, launches back to back) and each launch's span (%globaltimer, first CTA start to last
// CTA end), next to the bandwidth limit from a plain read of a large buffer in the same run.
// Not modelled: RoPE, the KV-cache append (the new k and v are read from the q|k|v buffer),
// norm weights (1 and 0).
// Build: nvcc -O3 -std=c++17 -arch=sm_90 bench/decode_megakernel_bench.cu -o decode_megakernel_bench
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(1);                                                                         \
        }                                                                                         \
    } while (0)

#ifndef CONSUMER_WARPS
#define CONSUMER_WARPS 8
#endif
constexpr int kConsumerWarps = CONSUMER_WARPS, kThreads = (kConsumerWarps + 1) * 32, kConsumers = kConsumerWarps * 32;
constexpr int kMaxSlots = 32, kMaxK = 5632, kMaxPositions = 64, kHeadDim = 64, kScratch = 1024;
constexpr int kStepsPerLayer = 5;

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

struct Params {
    Model m;
    int ctx, splits, ctas;
    const Layer* layers;
    const __half* lm_head;
    float* residual;   // [H]
    float* qkv;        // [qkvRows]
    float* attention;  // [heads][splits][2 + 64]: max, sum, unnormalised output
    float* hidden;     // [I]
    float2* best;      // [ctas]: (logit, token) of each CTA's rows of the LM head
    int* token;
    unsigned* counters;  // one per step, + epoch * ctas when the step is done
    unsigned epoch;
    int slots, slot_bytes, copy_bytes;  // the ring: slots x slot_bytes; bytes per bulk copy
    int striped;                        // 1: pieces striped over CTAs (see pieceRows)
    int diagnose;                       // 1: consumers skip the arithmetic; 2: the producer skips the copies (timing only)
    int lanes_copy;                     // 1: the producer warp's lanes copy 16 bytes each (cp.async) instead of the copy engine
    unsigned long long* span;    // [2]: first CTA start, last CTA end
    unsigned long long* stamps;  // [steps]: when CTA 0's consumers passed each step's wait
    unsigned long long* detail;  // [steps][2]: CTA 0's input loaded, its rows done
};

__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned smemAddress(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbarInit(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smemAddress(bar)), "r"(count));
}
__device__ __forceinline__ void mbarArrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smemAddress(bar)) : "memory");
}
__device__ __forceinline__ void mbarExpect(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smemAddress(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarWait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smemAddress(bar)), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulkCopy(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smemAddress(dst)), "l"(src),
                 "r"(bytes), "r"(smemAddress(bar))
                 : "memory");
}
// Barrier 1 joins the consumer warps only (the producer warp never waits on a step).
__device__ __forceinline__ void consumersSync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Step s of a token: layer s / 5, kind s % 5; then the LM head, then the argmax combine.
enum Kind { kQkv, kAttention, kOut, kFc, kDown, kLmHead, kCombine };
__host__ __device__ inline Kind kindOf(const Model& m, int s) { return s < m.layers * kStepsPerLayer ? Kind(s % kStepsPerLayer) : s == m.layers * kStepsPerLayer ? kLmHead : kCombine; }

struct Gemv {
    const __half* W = nullptr;
    int N = 0, K = 0, P = 1;  // P rows per task (2: a gate row and its up row)
};
__device__ inline Gemv gemvOf(const Params& p, int s) {
    const Model& m = p.m;
    const Kind kind = kindOf(m, s);
    if (kind == kLmHead) return {p.lm_head, m.vocab, m.H, 1};
    if (kind == kCombine || kind == kAttention) return {};
    const Layer& L = p.layers[s / kStepsPerLayer];
    if (kind == kQkv) return {L.qkv, m.qkvRows(), m.H, 1};
    if (kind == kOut) return {L.o, m.H, m.H, 1};
    if (kind == kFc) return {L.fc, m.fcRows(), m.H, m.gated ? 2 : 1};
    return {L.down, m.H, m.I, 1};
}
__device__ inline void rowsOf(const Gemv& g, int cta, int ctas, int& r0, int& r1) {
    const long long tasks = g.N / g.P;
    r0 = int(tasks * cta / ctas) * g.P;
    r1 = int(tasks * (cta + 1) / ctas) * g.P;
}
__device__ inline int rowsPerPiece(const Params& p, const Gemv& g) { return max(g.P, p.slot_bytes / (g.K * 2) / g.P * g.P); }

// Piece i of this CTA's rows of a step: [rs, re), false past the last. Striped (piece b of the
// matrix to CTA b mod ctas) so that all CTAs read neighbouring rows at once, except where
// `contiguous` (the output projection and down: each CTA keeps its rows of the residual).
__device__ inline bool pieceRows(const Params& p, const Gemv& g, int per, bool contiguous, int cta, int i, int& rs, int& re) {
    if (contiguous || !p.striped) {
        int r0, r1;
        rowsOf(g, cta, p.ctas, r0, r1);
        rs = r0 + i * per;
        re = min(r1, rs + per);
        return rs < r1;
    }
    rs = (cta + i * p.ctas) * per;
    re = min(g.N, rs + per);
    return rs < g.N;
}

__device__ __forceinline__ void arrive(const Params& p, int s) {
    consumersSync();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(p.counters + s, 1u);
    }
}
__device__ __forceinline__ void waitFor(const Params& p, int s) {
    if (threadIdx.x == 0) {
        const unsigned target = p.epoch * unsigned(p.ctas);
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(p.counters + s) : "memory");
        } while (seen < target);
        if (blockIdx.x == 0) p.stamps[s + 1] = now();
    }
    consumersSync();
}

// dst[0, n) = src[0, n) from L2 (written by other CTAs in this launch), 16-byte loads, four
// in flight per thread.
__device__ void loadVector(float* dst, const float* src, int n) {
    const int n4 = n / 4;
    for (int j = threadIdx.x; j < n4; j += 4 * kConsumers) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = j + u * kConsumers < n4 ? __ldcg(reinterpret_cast<const float4*>(src) + j + u * kConsumers) : float4{};
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (j + u * kConsumers < n4) reinterpret_cast<float4*>(dst)[j + u * kConsumers] = v[u];
    }
}

// x = norm(residual) in shared memory (LayerNorm for GPT-2, RMSNorm for Llama; weights 1, 0).
// Each thread sums and then normalises the 16-byte pieces it loaded itself.
__device__ void loadNormed(const Params& p, float* x, float* scratch) {
    const int H4 = p.m.H / 4, t = threadIdx.x;
    float s = 0.f, q = 0.f;
    loadVector(x, p.residual, p.m.H);
    for (int j = t; j < H4; j += kConsumers) {
        const float4 v = reinterpret_cast<const float4*>(x)[j];
        s += (v.x + v.y) + (v.z + v.w);
        q += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
    s = warpSum(s);
    q = warpSum(q);
    if (t % 32 == 0) scratch[t / 32] = s, scratch[kConsumerWarps + t / 32] = q;
    consumersSync();
    s = q = 0.f;
    for (int w = 0; w < kConsumerWarps; ++w) s += scratch[w], q += scratch[kConsumerWarps + w];
    const float H = float(p.m.H), mean = p.m.gated ? 0.f : s / H, inv = rsqrtf(q / H - mean * mean + 1e-5f);
    for (int j = t; j < H4; j += kConsumers) {
        float4 v = reinterpret_cast<const float4*>(x)[j];
        v.x = (v.x - mean) * inv, v.y = (v.y - mean) * inv, v.z = (v.z - mean) * inv, v.w = (v.w - mean) * inv;
        reinterpret_cast<float4*>(x)[j] = v;
    }
}

// x = the attention output, its splits combined: each split's weight exp(m - M) / L first
// (scratch), then the outputs, every split's load of an element issued together.
__device__ void loadAttention(const Params& p, float* x, float* scratch) {
    constexpr int kStride = 2 + kHeadDim, kMaxSplits = 8;
    const int parts = p.m.heads * p.splits;
    for (int i = threadIdx.x; i < parts; i += kConsumers) {
        const float2 ml = __ldcg(reinterpret_cast<const float2*>(p.attention + size_t(i) * kStride));
        scratch[i] = ml.x, scratch[parts + i] = ml.y;
    }
    consumersSync();
    for (int i = threadIdx.x; i < parts; i += kConsumers) {
        const int h = i / p.splits;
        float M = -INFINITY, L = 0.f;
        for (int sp = 0; sp < p.splits; ++sp) M = fmaxf(M, scratch[h * p.splits + sp]);
        for (int sp = 0; sp < p.splits; ++sp) L += __expf(scratch[h * p.splits + sp] - M) * scratch[parts + h * p.splits + sp];
        scratch[2 * parts + i] = __expf(scratch[i] - M) / L;
    }
    consumersSync();
    for (int j = threadIdx.x; j < p.m.H; j += kConsumers) {
        const int h = j / kHeadDim, d = j % kHeadDim;
        const float* part = p.attention + size_t(h) * p.splits * kStride + 2 + d;
        float v[kMaxSplits];
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp) v[sp] = sp < p.splits ? __ldcg(part + sp * kStride) : 0.f;
        float acc = 0.f;
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp)
            if (sp < p.splits) acc += scratch[2 * parts + h * p.splits + sp] * v[sp];
        x[j] = acc;
    }
}

// This lane's part of row . x (row: K8 16-byte pieces of f16 in shared memory, x: f32), two
// pieces at a time with two sums, so that loads and arithmetic overlap.
__device__ __forceinline__ float dot(const uint4* row, const float* x, int K8, int lane) {
    auto piece = [&](int k) {
        const uint4 w = row[k];
        const float4 xa = reinterpret_cast<const float4*>(x)[2 * k], xb = reinterpret_cast<const float4*>(x)[2 * k + 1];
        const __half2* w2 = reinterpret_cast<const __half2*>(&w);
        const float2 a = __half22float2(w2[0]), b = __half22float2(w2[1]), c = __half22float2(w2[2]), d = __half22float2(w2[3]);
        return fmaf(a.x, xa.x, fmaf(a.y, xa.y, fmaf(b.x, xa.z, b.y * xa.w))) + fmaf(c.x, xb.x, fmaf(c.y, xb.y, fmaf(d.x, xb.z, d.y * xb.w)));
    };
    float s0 = 0.f, s1 = 0.f;
    int k = lane;
    for (; k + 32 < K8; k += 64) s0 += piece(k), s1 += piece(k + 32);
    if (k < K8) s0 += piece(k);
    return s0 + s1;
}

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))); }
__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

// One attention split: positions [p0, p1) of the cache (+ the new token in the last split)
// for one query head. Keys and values are loaded before the wait: they do not depend on it.
__device__ void attention(const Params& p, int s, int task, __half* kv, float* scratch) {
    const Model& m = p.m;
    const int h = task / p.splits, sp = task % p.splits, kvh = h / (m.heads / m.kv_heads);
    const int p0 = p.ctx * sp / p.splits, p1 = p.ctx * (sp + 1) / p.splits, cached = p1 - p0;
    const bool last = sp == p.splits - 1;
    const Layer& L = p.layers[s / kStepsPerLayer];
    const size_t base = (size_t(kvh) * p.ctx + p0) * kHeadDim;
    __half *ks = kv, *vs = kv + (kMaxPositions + 1) * kHeadDim;
    for (int j = threadIdx.x; j < cached * kHeadDim / 8; j += kConsumers) {
        reinterpret_cast<uint4*>(ks)[j] = __ldg(reinterpret_cast<const uint4*>(L.k_cache + base) + j);
        reinterpret_cast<uint4*>(vs)[j] = __ldg(reinterpret_cast<const uint4*>(L.v_cache + base) + j);
    }
    waitFor(p, s - 1);
    float* q = scratch;             // [64]
    float* scores = scratch + 64;   // [kMaxPositions + 1]
    const int t = threadIdx.x, n = cached + (last ? 1 : 0);
    if (t < kHeadDim) {
        q[t] = __ldcg(p.qkv + h * kHeadDim + t) * rsqrtf(float(kHeadDim));
        if (last) {
            ks[cached * kHeadDim + t] = __float2half(__ldcg(p.qkv + m.H + kvh * kHeadDim + t));
            vs[cached * kHeadDim + t] = __float2half(__ldcg(p.qkv + m.H + m.kv_heads * kHeadDim + kvh * kHeadDim + t));
        }
    }
    consumersSync();
    const int warp = t / 32, lane = t % 32;
    for (int i = warp; i < n; i += kConsumerWarps) {
        const __half2 k2 = reinterpret_cast<const __half2*>(ks + i * kHeadDim)[lane];
        const float v = warpSum(q[2 * lane] * __low2float(k2) + q[2 * lane + 1] * __high2float(k2));
        if (lane == 0) scores[i] = v;
    }
    consumersSync();
    if (t < kHeadDim) {
        float M = -INFINITY;
        for (int i = 0; i < n; ++i) M = fmaxf(M, scores[i]);
        float sum = 0.f, acc = 0.f;
        for (int i = 0; i < n; ++i) {
            const float w = __expf(scores[i] - M);
            sum += w;
            acc += w * __half2float(vs[i * kHeadDim + t]);
        }
        float* out = p.attention + (size_t(h) * p.splits + sp) * (2 + kHeadDim);
        out[2 + t] = acc;
        if (t == 0) out[0] = M, out[1] = sum;
    }
}

__global__ void __launch_bounds__(kThreads, 1) decodeToken(Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + p.slots * p.slot_bytes);
    unsigned long long* empty = full + kMaxSlots;
    float* x = reinterpret_cast<float*>(empty + kMaxSlots);
    float* scratch = x + kMaxK;                                 // sums, split weights, or q + scores
    __half* kv = reinterpret_cast<__half*>(scratch + kScratch);  // 2 x (kMaxPositions + 1) x 64
    float* own = reinterpret_cast<float*>(kv + 2 * (kMaxPositions + 1) * kHeadDim);  // this CTA's rows of the residual
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cta = blockIdx.x;
    const int steps = p.m.layers * kStepsPerLayer + 2;
    if (threadIdx.x == 0) {
        atomicMin(p.span, now());
        if (cta == 0) p.stamps[0] = now();
        for (int i = 0; i < p.slots; ++i) mbarInit(full + i, p.lanes_copy ? 32 : 1), mbarInit(empty + i, kConsumerWarps);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumerWarps) {  // the producer: every weight slice of this CTA, in order of use
        if (lane != 0 && !p.lanes_copy) return;
        unsigned piece = 0;
        for (int s = 0; s < steps; ++s) {
            const Gemv g = gemvOf(p, s);
            if (!g.W) continue;
            const int per = rowsPerPiece(p, g);
            const bool contiguous = kindOf(p.m, s) == kOut || kindOf(p.m, s) == kDown;
            int r, re;
            for (int i = 0; pieceRows(p, g, per, contiguous, cta, i, r, re); ++i, ++piece) {
                const unsigned slots = p.slots, slot = piece % slots, bytes = unsigned(re - r) * g.K * 2;
                if (piece >= slots) mbarWait(empty + slot, (piece / slots - 1) & 1);
                const unsigned char* src = reinterpret_cast<const unsigned char*>(g.W + size_t(r) * g.K);
                unsigned char* dst = ring + slot * p.slot_bytes;
                if (p.diagnose == 2) {
                    if (lane == 0) mbarArrive(full + slot);
                    if (p.lanes_copy)
                        for (int l = 1; l < 32; ++l)
                            if (lane == 0) mbarArrive(full + slot);
                } else if (p.lanes_copy) {
                    for (unsigned o = lane * 16; o < bytes; o += 32 * 16)
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smemAddress(dst + o)), "l"(src + o) : "memory");
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smemAddress(full + slot)) : "memory");
                } else {
                    mbarExpect(full + slot, bytes);
                    for (unsigned o = 0; o < bytes; o += p.copy_bytes) bulkCopy(dst + o, src + o, min(bytes - o, unsigned(p.copy_bytes)), full + slot);
                }
            }
        }
        if (p.lanes_copy) asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    {  // the rows of the residual this CTA adds to (the output projection's and down's rows)
        int r0, r1;
        rowsOf(gemvOf(p, kOut), cta, p.ctas, r0, r1);
        for (int n = r0 + threadIdx.x; n < r1; n += kConsumers) own[n - r0] = p.residual[n];
    }
    unsigned piece = 0;
    for (int s = 0; s < steps; ++s) {
        const Kind kind = kindOf(p.m, s);
        if (kind == kAttention) {
            if (cta < p.m.heads * p.splits) attention(p, s, cta, kv, scratch);
            arrive(p, s);
            continue;
        }
        if (kind == kCombine) {
            waitFor(p, s - 1);
            if (cta == 0 && warp == 0) {
                float2 b = make_float2(-INFINITY, 0.f);
                for (int c = lane; c < p.ctas; c += 32) {
                    const float2 v = __ldcg(p.best + c);
                    if (v.x > b.x || (v.x == b.x && v.y < b.y)) b = v;
                }
                for (int o = 16; o > 0; o >>= 1) {
                    const float2 v = make_float2(__shfl_xor_sync(0xffffffffu, b.x, o), __shfl_xor_sync(0xffffffffu, b.y, o));
                    if (v.x > b.x || (v.x == b.x && v.y < b.y)) b = v;
                }
                if (lane == 0) *p.token = int(b.y);
            }
            break;
        }
        const Gemv g = gemvOf(p, s);
        int r0, r1;
        rowsOf(g, cta, p.ctas, r0, r1);
        if (s > 0) waitFor(p, s - 1);
        if (kind == kQkv || kind == kFc || kind == kLmHead)
            loadNormed(p, x, scratch);
        else if (kind == kOut)
            loadAttention(p, x, scratch);
        else
            loadVector(x, p.hidden, g.K);
        consumersSync();
        if (cta == 0 && threadIdx.x == 0) p.detail[2 * s] = now();
        const int per = rowsPerPiece(p, g), K8 = g.K / 8;
        const bool contiguous = kind == kOut || kind == kDown;
        float best = -INFINITY, best_row = 0.f;
        int r, re, before = 0;
        for (int i = 0; pieceRows(p, g, per, contiguous, cta, i, r, re); ++i, ++piece) {
            const unsigned slot = piece % unsigned(p.slots);
            const int rows = re - r;
            mbarWait(full + slot, (piece / unsigned(p.slots)) & 1);
            const __half* W = reinterpret_cast<const __half*>(ring + slot * p.slot_bytes);
            // Tasks go to warps in turn across the step, not from warp 0 in each piece: with a
            // task or two per piece, all warps then work on different pieces at once.
            for (int task = p.diagnose == 1 ? rows : (warp - before % kConsumerWarps + kConsumerWarps) % kConsumerWarps; task < rows / g.P; task += kConsumerWarps) {
                float y[2] = {0.f, 0.f};
                for (int j = 0; j < g.P; ++j) y[j] = warpSum(dot(reinterpret_cast<const uint4*>(W + size_t(task * g.P + j) * g.K), x, K8, lane));
                const int n = r + task * g.P;
                if (lane == 0) {
                    if (kind == kQkv)
                        p.qkv[n] = y[0];
                    else if (kind == kOut || kind == kDown)
                        p.residual[n] = own[n - r0] += y[0];
                    else if (kind == kFc)
                        p.hidden[n / g.P] = g.P == 2 ? silu(y[0]) * y[1] : gelu(y[0]);
                    else if (y[0] > best)
                        best = y[0], best_row = float(n);
                }
            }
            before += rows / g.P;
            __syncwarp();
            if (lane == 0) mbarArrive(empty + slot);
        }
        if (cta == 0 && lane == 0) atomicMax(p.detail + 2 * s + 1, now());
        if (kind == kLmHead) {
            if (lane == 0) scratch[warp] = best, scratch[kConsumerWarps + warp] = best_row;
            consumersSync();
            if (threadIdx.x == 0) {
                float2 b = make_float2(scratch[0], scratch[kConsumerWarps]);
                for (int w = 1; w < kConsumerWarps; ++w)
                    if (scratch[w] > b.x || (scratch[w] == b.x && scratch[kConsumerWarps + w] < b.y)) b = make_float2(scratch[w], scratch[kConsumerWarps + w]);
                p.best[cta] = b;
            }
        }
        arrive(p, s);
    }
    consumersSync();
    if (threadIdx.x == 0) atomicMax(p.span + 1, now());
}

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

struct Run {
    double step_us[7];  // per kind: from the wait before it to the wait after it, CTA 0, mean
    double input_us[7], rows_us[7];  // of which: the input loaded, then the rows done
    double ms_per_token, span_us, limit_ms;
    bool correct;
    float max_error;
};

struct Ring {
    int slots, slot_bytes, copy_bytes, lanes_copy, striped, diagnose;
};

static Run runModel(const Model& m, int ctx, int sms, double gbs, int tokens, Ring ring) {
    std::vector<void*> owned;
    auto alloc = [&](size_t bytes) {
        void* p;
        CHECK(cudaMalloc(&p, bytes));
        owned.push_back(p);
        return p;
    };
    unsigned seed = 1;
    auto weights = [&](size_t rows, size_t K, float scale = 0.f) {
        __half* w = static_cast<__half*>(alloc(rows * K * 2));
        fillRandom<<<sms * 8, 256>>>(w, rows * K, seed++, scale > 0.f ? scale : 1.f / std::sqrt(float(K)));
        return static_cast<const __half*>(w);
    };
    std::vector<Layer> layers(m.layers);
    for (auto& L : layers) {
        L.qkv = weights(m.qkvRows(), m.H);
        L.o = weights(m.H, m.H);
        L.fc = weights(m.fcRows(), m.H);
        L.down = weights(m.H, m.I);
        L.k_cache = weights(size_t(m.kv_heads) * ctx, kHeadDim, 1.f);
        L.v_cache = weights(size_t(m.kv_heads) * ctx, kHeadDim, 1.f);
    }
    Params p{};
    p.m = m;
    p.ctx = ctx;
    p.ctas = sms;
    p.slots = ring.slots, p.slot_bytes = ring.slot_bytes, p.copy_bytes = ring.copy_bytes, p.lanes_copy = ring.lanes_copy, p.striped = ring.striped, p.diagnose = ring.diagnose;
    p.splits = std::min(8, std::max(1, sms / m.heads));
    while (ctx / p.splits + 1 > kMaxPositions + 1 || ctx % p.splits) ++p.splits;
    if (m.heads * p.splits > sms) {
        std::printf("%s: %d heads x %d splits do not fit %d CTAs\n", m.name, m.heads, p.splits, sms);
        std::exit(1);
    }
    Layer* dlayers = static_cast<Layer*>(alloc(sizeof(Layer) * m.layers));
    CHECK(cudaMemcpy(dlayers, layers.data(), sizeof(Layer) * m.layers, cudaMemcpyHostToDevice));
    p.layers = dlayers;
    p.lm_head = weights(m.vocab, m.H);
    p.residual = static_cast<float*>(alloc(m.H * 4));
    p.qkv = static_cast<float*>(alloc(m.qkvRows() * 4));
    p.attention = static_cast<float*>(alloc(size_t(m.heads) * p.splits * (2 + kHeadDim) * 4));
    p.hidden = static_cast<float*>(alloc(m.I * 4));
    p.best = static_cast<float2*>(alloc(sms * 8));
    p.token = static_cast<int*>(alloc(4));
    const int steps = m.layers * kStepsPerLayer + 2;
    p.counters = static_cast<unsigned*>(alloc(steps * 4));
    CHECK(cudaMemset(p.counters, 0, steps * 4));
    p.span = static_cast<unsigned long long*>(alloc(16));
    p.stamps = static_cast<unsigned long long*>(alloc((steps + 1) * 8));
    p.detail = static_cast<unsigned long long*>(alloc(2 * steps * 8));

    std::vector<float> start(m.H);
    for (int j = 0; j < m.H; ++j) start[j] = std::sin(0.37f * j + 1.f) * 2.f;
    CHECK(cudaDeviceSynchronize());

    // Reference first (a token from `start`).
    float *ref_r = static_cast<float*>(alloc(m.H * 4)), *ref_x = static_cast<float*>(alloc(kMaxK * 4));
    float *ref_y = static_cast<float*>(alloc(size_t(std::max(m.vocab, 2 * m.I)) * 4)), *ref_qkv = static_cast<float*>(alloc(m.qkvRows() * 4));
    float* ref_h = static_cast<float*>(alloc(m.I * 4));
    CHECK(cudaMemcpy(ref_r, start.data(), m.H * 4, cudaMemcpyHostToDevice));
    auto blocks = [](int n) { return (n + 127) / 128; };
    for (int l = 0; l < m.layers; ++l) {
        const Layer& L = layers[l];
        refNorm<<<1, 1024>>>(ref_r, ref_x, m.H, m.gated);
        refGemv<<<blocks(m.qkvRows()), 128>>>(L.qkv, ref_x, ref_qkv, m.qkvRows(), m.H);
        refAttention<<<m.heads, kHeadDim>>>(m, L, ctx, ref_qkv, ref_x);
        refGemv<<<blocks(m.H), 128>>>(L.o, ref_x, ref_y, m.H, m.H);
        refAdd<<<blocks(m.H), 128>>>(ref_r, ref_y, m.H);
        refNorm<<<1, 1024>>>(ref_r, ref_x, m.H, m.gated);
        refGemv<<<blocks(m.fcRows()), 128>>>(L.fc, ref_x, ref_y, m.fcRows(), m.H);
        refActivation<<<blocks(m.I), 128>>>(ref_y, ref_h, m.I, m.gated);
        refGemv<<<blocks(m.H), 128>>>(L.down, ref_h, ref_y, m.H, m.I);
        refAdd<<<blocks(m.H), 128>>>(ref_r, ref_y, m.H);
    }
    refNorm<<<1, 1024>>>(ref_r, ref_x, m.H, m.gated);
    refGemv<<<blocks(m.vocab), 128>>>(p.lm_head, ref_x, ref_y, m.vocab, m.H);
    CHECK(cudaGetLastError());
    std::vector<float> ref_final(m.H), logits(m.vocab);
    CHECK(cudaMemcpy(ref_final.data(), ref_r, m.H * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(logits.data(), ref_y, m.vocab * 4, cudaMemcpyDeviceToHost));
    const int ref_token = int(std::max_element(logits.begin(), logits.end()) - logits.begin());

    const size_t smem = size_t(p.slots) * p.slot_bytes + 2 * kMaxSlots * 8 + (kMaxK + kScratch) * 4 + 2 * (kMaxPositions + 1) * kHeadDim * 2 + 64 * 4;
    CHECK(cudaFuncSetAttribute(decodeToken, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decodeToken, kThreads, smem));
    if (per_sm < 1) {
        std::printf("decodeToken does not fit an SM (%zu bytes of shared memory)\n", smem);
        std::exit(1);
    }
    auto launch = [&](bool reset_span) {
        ++p.epoch;
        if (reset_span) {
            CHECK(cudaMemsetAsync(p.span, 0xFF, 8));
            CHECK(cudaMemsetAsync(p.span + 1, 0, 8));
        }
        void* args[] = {&p};
        CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(decodeToken), dim3(sms), dim3(kThreads), args, smem, nullptr));
    };
    CHECK(cudaMemcpy(p.residual, start.data(), m.H * 4, cudaMemcpyHostToDevice));
    launch(true);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> got(m.H);
    int token = -1;
    CHECK(cudaMemcpy(got.data(), p.residual, m.H * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&token, p.token, 4, cudaMemcpyDeviceToHost));
    float max_error = 0.f, max_ref = 0.f;
    for (int j = 0; j < m.H; ++j) max_error = std::max(max_error, std::fabs(got[j] - ref_final[j])), max_ref = std::max(max_ref, std::fabs(ref_final[j]));
    max_error /= std::max(max_ref, 1e-6f);
    std::vector<float> sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    const bool tie = sorted[0] - sorted[1] < 1e-3f * std::fabs(sorted[0]);
    const bool correct = max_error < 2e-3f && (token == ref_token || tie);
    std::printf("%s: residual max error %.2e (relative to its largest element), token %d (reference %d%s)\n", m.name, max_error, token, ref_token,
                tie ? ", near tie" : "");

    // Timing: tokens back to back, each a launch.
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; ++i) launch(false);
    std::vector<double> spans, step_sum(7, 0.0);
    std::vector<int> step_count(7, 0);
    std::vector<unsigned long long> st(steps + 1), dt(2 * steps);
    std::vector<double> input_sum(7, 0.0), rows_sum(7, 0.0);
    for (int i = 0; i < tokens; ++i) {
        CHECK(cudaMemsetAsync(p.detail, 0, 2 * steps * 8));
        launch(true);
        unsigned long long s[2];
        CHECK(cudaMemcpy(s, p.span, 16, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(st.data(), p.stamps, st.size() * 8, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(dt.data(), p.detail, dt.size() * 8, cudaMemcpyDeviceToHost));
        spans.push_back((s[1] - s[0]) * 1e-3);
        // Stamp s + 1 is the wait for step s's end: the time of step s is stamp[s+1] - stamp[s]
        // (stamp 0, the start, stands for step 0's wait).
        for (int k = 0; k + 1 < steps; ++k) {
            const Kind kind = kindOf(m, k);
            step_sum[kind] += (st[k + 1] - st[k]) * 1e-3;
            ++step_count[kind];
            if (dt[2 * k]) input_sum[kind] += (dt[2 * k] - st[k]) * 1e-3, rows_sum[kind] += (dt[2 * k + 1] - dt[2 * k]) * 1e-3;
        }
    }
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < tokens; ++i) launch(false);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    Run r{};
    r.ms_per_token = ms / tokens, r.span_us = median(spans), r.limit_ms = m.weightBytes() / (gbs * 1e9) * 1e3, r.correct = correct, r.max_error = max_error;
    for (int k = 0; k < 7; ++k) {
        r.step_us[k] = step_count[k] ? step_sum[k] / step_count[k] : 0.0;
        r.input_us[k] = step_count[k] ? input_sum[k] / step_count[k] : 0.0;
        r.rows_us[k] = step_count[k] ? rows_sum[k] / step_count[k] : 0.0;
    }
    for (void* q : owned) CHECK(cudaFree(q));
    return r;
}

int main(int argc, char** argv) {
    int tokens = 200, ctx = 256;
    Ring ring{7, 24576, 24576, 0, 1, 0};
    const char* only = nullptr;
    for (int i = 1; i < argc; ++i) {
        auto value = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : -1; };
        if (!std::strcmp(argv[i], "--tokens")) tokens = value();
        else if (!std::strcmp(argv[i], "--ctx")) ctx = value();
        else if (!std::strcmp(argv[i], "--slots")) ring.slots = value();
        else if (!std::strcmp(argv[i], "--slot-kb")) ring.slot_bytes = value() * 1024;
        else if (!std::strcmp(argv[i], "--copy-kb")) ring.copy_bytes = value() * 1024;
        else if (!std::strcmp(argv[i], "--lanes-copy")) ring.lanes_copy = 1;
        else if (!std::strcmp(argv[i], "--contiguous")) ring.striped = 0;
        else if (!std::strcmp(argv[i], "--diagnose")) ring.diagnose = value();
        else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) only = argv[++i];
        else {
            std::printf("usage: %s [--tokens N] [--ctx POSITIONS] [--slots N] [--slot-kb KB] [--copy-kb KB] [--lanes-copy] [--contiguous] [--diagnose 1|2] [--model gpt2|llama1b]\n", argv[0]);
            return 2;
        }
    }
    ring.copy_bytes = std::min(ring.copy_bytes, ring.slot_bytes);
    if (tokens < 1 || ctx < 8 || ring.slots < 2 || ring.slots > kMaxSlots || ring.slot_bytes < 12288 || ring.copy_bytes < 1024) {
        std::printf("bad value: tokens >= 1, ctx >= 8, 2 <= slots <= %d, slot-kb >= 12 (a row of down), copy-kb >= 1\n", kMaxSlots);
        return 2;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const double gbs = measureBandwidth(sms);
    std::printf("%s, %d SMs, read bandwidth %.0f GB/s, context %d positions, ring %d x %d KB, %s\n", prop.name, sms, gbs, ctx, ring.slots,
                ring.slot_bytes / 1024, ring.lanes_copy ? "lanes copy 16 bytes each (cp.async)" : "copy engine (cp.async.bulk)");
    std::printf("pieces %s, %d consumer warps%s\n", ring.striped ? "striped over CTAs (o, down: contiguous)" : "contiguous per CTA", kConsumerWarps,
                ring.diagnose == 1 ? ", DIAGNOSTIC: no arithmetic" : ring.diagnose == 2 ? ", DIAGNOSTIC: no copies" : "");
    std::vector<Model> models;
    for (const Model& m : {Model{"gpt2", 768, 3072, 12, 12, 12, 50257, false}, Model{"llama1b", 2048, 5632, 32, 4, 22, 32000, true}})
        if (!only || !std::strcmp(only, m.name)) models.push_back(m);
    std::vector<Run> runs;
    for (const Model& m : models) runs.push_back(runModel(m, ctx, sms, gbs, tokens, ring));
    std::printf("\n%-8s %10s %12s %10s %8s %8s %s\n", "model", "weights", "ms/token", "span us", "limit", "ratio", "check");
    for (size_t i = 0; i < runs.size(); ++i)
        std::printf("%-8s %8.1fMB %12.4f %10.1f %8.4f %7.2fx %s\n", models[i].name, models[i].weightBytes() / 1e6, runs[i].ms_per_token, runs[i].span_us,
                    runs[i].limit_ms, runs[i].ms_per_token / runs[i].limit_ms, runs[i].correct ? "ok" : "WRONG");
    std::printf("us per step, CTA 0, mean: wait to wait (input loaded + rows done + the rest)\n%-8s %18s %18s %18s %18s %18s %18s\n", "model", "q|k|v",
                "attention", "o", "fc", "down", "lm head");
    for (size_t i = 0; i < runs.size(); ++i) {
        std::printf("%-8s", models[i].name);
        for (int k = 0; k < 6; ++k) std::printf(" %5.2f (%.1f+%.1f+%.1f)", runs[i].step_us[k], runs[i].input_us[k], runs[i].rows_us[k], runs[i].step_us[k] - runs[i].input_us[k] - runs[i].rows_us[k]);
        std::printf("\n");
    }
    return 0;
}
