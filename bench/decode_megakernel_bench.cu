// Can batch-1 decode of a small model come within 1.5x of the HBM bandwidth limit on this GPU?
// A feasibility benchmark for one design, standalone (random fp16 weights of the GPT-2-small
// and Llama-1.1B shapes): a token's whole forward pass as one persistent kernel, one CTA per SM.
//
// Why this design: in Kiln's decoder every dependent step (a kernel, or a phase of the layers
// kernel) streams its own weights only after its wait, so each of a layer's five steps pays a
// DRAM round trip plus the synchronisation (bench/results/2026-12-04-*). Here each CTA's
// producer warp streams the CTA's fixed slice of every weight matrix, in the order they are
// used, through a ring of shared-memory slots with the copy engine (cp.async.bulk + mbarrier;
// or its lanes' cp.async), never waiting on a dependency: only on a free slot. The consumer
// warps wait for a step's input itself: every value that crosses CTAs is written as one 64-bit
// word with the flag of the step that wrote it (see Word), so there is no barrier, counter or
// fence. (The first version, commit 9715abe, used a grid barrier per step: no faster.) Steps
// per layer: q|k|v (norm fused), attention (split over positions), output projection +=
// residual, fc or gate|up (norm fused, GELU or SwiGLU), down += residual; then the LM head with
// an argmax per CTA and a last step that combines them. Each row of a GEMV belongs to one CTA,
// so the residual adds are plain and the results deterministic. --diagnose times the same
// chain without the arithmetic and/or the copies.
//
// Checked against a chain of naive kernels (f32, f64 sums) on the same data: the residual
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

#include "decode_megakernel/device_primitives.cuh"
#include "decode_megakernel/model_reference.cuh"
#include "decode_megakernel/hand_off.cuh"

#ifndef CONSUMER_WARPS
#define CONSUMER_WARPS 8
#endif
constexpr int kConsumerWarps = CONSUMER_WARPS, kThreads = (kConsumerWarps + 1) * 32, kConsumers = kConsumerWarps * 32;
constexpr int kMaxSlots = 32, kMaxK = 5632, kMaxPositions = 64, kScratch = 1024;
constexpr int kStepsPerLayer = 5;

// How weights reach shared memory, and the benchmark's diagnostic modes.
struct Ring {
    int slots, slot_bytes, copy_bytes;  // slots x slot_bytes; bytes per bulk copy
    int lanes_copy;                     // 1: the producer warp's lanes copy 16 bytes each (cp.async) instead of the copy engine
    int striped;                        // 1: pieces striped over CTAs (see pieceRows)
    int diagnose;  // timing only: 1 the consumers skip the arithmetic (outputs 0); 2 the producer skips the copies; 3 both
};

struct Params {
    Model m;
    int ctx, splits, ctas;
    const Layer* layers;
    const __half* lm_head;
    Word* residual;   // [H]
    Word* qkv;        // [qkvRows]
    Word* attention;  // [heads][splits][2 + 64]: max, sum, unnormalised output
    Word* hidden;     // [I]
    Word* best;       // [ctas][2]: logit, token of each CTA's rows of the LM head
    int* token;
    unsigned epoch;       // the token: step s of it writes flag epoch * 256 + s + 1
    unsigned start_flag;  // the flag the residual carries at the start
    Ring ring;
    unsigned long long* span;    // [2]: first CTA start, last CTA end
    unsigned long long* stamps;  // [steps]: when CTA 0's consumers began each step
    unsigned long long* detail;  // [steps][2]: CTA 0's input loaded, its rows done
};

// Barrier 1 joins the consumer warps only (the producer warp never waits on a step).
__device__ __forceinline__ void consumersSync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }

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
__device__ inline int rowsPerPiece(const Params& p, const Gemv& g) { return max(g.P, p.ring.slot_bytes / (g.K * 2) / g.P * g.P); }

// Piece i of this CTA's rows of step s: [rs, re), false past the last. Striped (piece b of the
// matrix to CTA b mod ctas) so that all CTAs read neighbouring rows at once, except for the
// output projection and down: each CTA keeps its rows of the residual, the same in both.
__device__ inline bool pieceRows(const Params& p, int s, const Gemv& g, int per, int cta, int i, int& rs, int& re) {
    const Kind kind = kindOf(p.m, s);
    if (kind == kOut || kind == kDown || !p.ring.striped) {
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

__device__ __forceinline__ unsigned flagOf(const Params& p, int s) { return p.epoch * 256u + unsigned(s) + 1u; }
// dst[0, n) = src[0, n) once each word carries flag; four loads in flight per thread.
__device__ void awaitVector(float* dst, const Word* src, int n, unsigned flag) {
    for (int j = threadIdx.x; j < n; j += 4 * kConsumers) {
        Word w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (j + u * kConsumers < n) w[u] = loadWord(src + j + u * kConsumers);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = j + u * kConsumers;
            if (i >= n) break;
            while (unsigned(w[u] >> 32) != flag) w[u] = loadWord(src + i);
            dst[i] = valueOf(w[u]);
        }
    }
}

// xh = x in f16, for the arithmetic (16 products per f16 sum, as Kiln's decoder does).
__device__ void toHalf(const float* x, __half* xh, int n) {
    for (int j = threadIdx.x; j < n / 2; j += kConsumers) reinterpret_cast<__half2*>(xh)[j] = __floats2half2_rn(x[2 * j], x[2 * j + 1]);
}

// x = norm(residual) (LayerNorm for GPT-2, RMSNorm for Llama; weights 1, 0).
__device__ void loadNormed(const Params& p, float* x, float* scratch, unsigned flag) {
    const int H = p.m.H, t = threadIdx.x;
    awaitVector(x, p.residual, H, flag);
    float s = 0.f, q = 0.f;
    for (int j = t; j < H; j += kConsumers) s += x[j], q += x[j] * x[j];  // the elements this thread loaded
    s = warpSum(s);
    q = warpSum(q);
    if (t % 32 == 0) scratch[t / 32] = s, scratch[kConsumerWarps + t / 32] = q;
    consumersSync();
    s = q = 0.f;
    for (int w = 0; w < kConsumerWarps; ++w) s += scratch[w], q += scratch[kConsumerWarps + w];
    const float mean = p.m.gated ? 0.f : s / H, inv = rsqrtf(q / H - mean * mean + 1e-5f);
    for (int j = t; j < H; j += kConsumers) x[j] = (x[j] - mean) * inv;
}

// x = the attention output, its splits combined: each split's weight exp(m - M) / L first
// (scratch), then the outputs, every split's load of an element issued together.
__device__ void loadAttention(const Params& p, float* x, float* scratch, unsigned flag) {
    constexpr int kStride = 2 + kHeadDim, kMaxSplits = 8;
    const int parts = p.m.heads * p.splits;
    for (int i = threadIdx.x; i < parts; i += kConsumers) {
        const Word* part = p.attention + size_t(i) * kStride;
        scratch[i] = awaitWord(part, flag), scratch[parts + i] = awaitWord(part + 1, flag);
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
        const Word* part = p.attention + size_t(h) * p.splits * kStride + 2 + d;
        Word w[kMaxSplits];
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp)
            if (sp < p.splits) w[sp] = loadWord(part + sp * kStride);
        float acc = 0.f;
#pragma unroll
        for (int sp = 0; sp < kMaxSplits; ++sp) {
            if (sp >= p.splits) break;
            while (unsigned(w[sp] >> 32) != flag) w[sp] = loadWord(part + sp * kStride);
            acc += scratch[2 * parts + h * p.splits + sp] * valueOf(w[sp]);
        }
        x[j] = acc;
    }
}

// This lane's parts of rows[0, n) . x for n <= 4 rows of K8 16-byte pieces of f16 in shared
// memory: each piece's 8 products summed in f16, then in f32; one piece of x for all rows.
__device__ __forceinline__ void dotRows(const __half* W, int K, int n, const __half* xh, int lane, float (&acc)[4]) {
    const int K8 = K / 8;
    for (int k = lane; k < K8; k += 32) {
        const uint4 xv = reinterpret_cast<const uint4*>(xh)[k];
        const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j >= n) break;
            const uint4 wv = reinterpret_cast<const uint4*>(W + size_t(j) * K)[k];
            const __half2* w2 = reinterpret_cast<const __half2*>(&wv);
            __half2 s2 = __hmul2(w2[0], x2[0]);
            s2 = __hfma2(w2[1], x2[1], s2);
            s2 = __hfma2(w2[2], x2[2], s2);
            s2 = __hfma2(w2[3], x2[3], s2);
            const float2 f = __half22float2(s2);
            acc[j] += f.x + f.y;
        }
    }
}

// One attention split: positions [p0, p1) of the cache (+ the new token in the last split)
// for one query head. Keys and values are loaded before the wait: they do not depend on it.
__device__ void attention(const Params& p, int s, int task, __half* kv, float* scratch) {
    const Model& m = p.m;
    const int h = task / p.splits, sp = task % p.splits, kvh = h / (m.heads / m.kv_heads);
    const int p0 = p.ctx * sp / p.splits, p1 = p.ctx * (sp + 1) / p.splits, cached = p1 - p0;
    const bool last = sp == p.splits - 1;
    const unsigned in = flagOf(p, s - 1), out_flag = flagOf(p, s);
    const Layer& L = p.layers[s / kStepsPerLayer];
    const size_t base = (size_t(kvh) * p.ctx + p0) * kHeadDim;
    __half *ks = kv, *vs = kv + (kMaxPositions + 1) * kHeadDim;
    for (int j = threadIdx.x; j < cached * kHeadDim / 8; j += kConsumers) {
        reinterpret_cast<uint4*>(ks)[j] = __ldg(reinterpret_cast<const uint4*>(L.k_cache + base) + j);
        reinterpret_cast<uint4*>(vs)[j] = __ldg(reinterpret_cast<const uint4*>(L.v_cache + base) + j);
    }
    float* q = scratch;            // [64]
    float* scores = scratch + 64;  // [kMaxPositions + 1]
    const int t = threadIdx.x, n = cached + (last ? 1 : 0);
    if (t < kHeadDim) {
        const Word* qw = p.qkv + h * kHeadDim + t;
        const Word* kw = p.qkv + m.H + kvh * kHeadDim + t;
        const Word* vw = p.qkv + m.H + m.kv_heads * kHeadDim + kvh * kHeadDim + t;
        q[t] = awaitWord(qw, in) * rsqrtf(float(kHeadDim));
        if (last) ks[cached * kHeadDim + t] = __float2half(awaitWord(kw, in)), vs[cached * kHeadDim + t] = __float2half(awaitWord(vw, in));
    }
    consumersSync();
    if (blockIdx.x == 0 && t == 0) p.detail[2 * s] = now();
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
        Word* out = p.attention + (size_t(h) * p.splits + sp) * (2 + kHeadDim);
        storeWord(out + 2 + t, acc, out_flag);
        if (t == 0) storeWord(out, M, out_flag), storeWord(out + 1, sum, out_flag);
    }
    if (blockIdx.x == 0 && t == 0) p.detail[2 * s + 1] = now();
    consumersSync();
}

__global__ void __launch_bounds__(kThreads, 1) decodeToken(Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char* ring = smem;
    unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + p.ring.slots * p.ring.slot_bytes);
    unsigned long long* empty = full + kMaxSlots;
    float* x = reinterpret_cast<float*>(empty + kMaxSlots);
    __half* xh = reinterpret_cast<__half*>(x + kMaxK);
    float* scratch = reinterpret_cast<float*>(xh + kMaxK);       // sums, split weights, or q + scores
    __half* kv = reinterpret_cast<__half*>(scratch + kScratch);  // 2 x (kMaxPositions + 1) x 64
    float* own = reinterpret_cast<float*>(kv + 2 * (kMaxPositions + 1) * kHeadDim);  // this CTA's rows of the residual
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cta = blockIdx.x;
    const int steps = p.m.layers * kStepsPerLayer + 2;
    if (threadIdx.x == 0) {
        atomicMin(p.span, now());
        for (int i = 0; i < p.ring.slots; ++i) mbarInit(full + i, p.ring.lanes_copy ? 32 : 1), mbarInit(empty + i, kConsumerWarps);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumerWarps) {  // the producer: every weight slice of this CTA, in order of use
        if (lane != 0 && !p.ring.lanes_copy) return;
        unsigned piece = 0;
        for (int s = 0; s < steps; ++s) {
            const Gemv g = gemvOf(p, s);
            if (!g.W) continue;
            const int per = rowsPerPiece(p, g);
            int r, re;
            for (int i = 0; pieceRows(p, s, g, per, cta, i, r, re); ++i, ++piece) {
                const unsigned slots = p.ring.slots, slot = piece % slots, bytes = unsigned(re - r) * g.K * 2;
                if (piece >= slots) mbarWait(empty + slot, (piece / slots - 1) & 1);
                const unsigned char* src = reinterpret_cast<const unsigned char*>(g.W + size_t(r) * g.K);
                unsigned char* dst = ring + slot * p.ring.slot_bytes;
                if (p.ring.diagnose >= 2) {
                    if (lane == 0)
                        for (int l = 0; l < (p.ring.lanes_copy ? 32 : 1); ++l) mbarArrive(full + slot);
                } else if (p.ring.lanes_copy) {
                    for (unsigned o = lane * 16; o < bytes; o += 32 * 16)
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smemAddress(dst + o)), "l"(src + o) : "memory");
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smemAddress(full + slot)) : "memory");
                } else {
                    mbarExpect(full + slot, bytes);
                    for (unsigned o = 0; o < bytes; o += p.ring.copy_bytes) bulkCopy(dst + o, src + o, min(bytes - o, unsigned(p.ring.copy_bytes)), full + slot);
                }
            }
        }
        if (p.ring.lanes_copy) asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }

    int own0, own1;  // the rows of the residual this CTA adds to (the output projection's and down's)
    rowsOf(gemvOf(p, kOut), cta, p.ctas, own0, own1);
    for (int n = own0 + threadIdx.x; n < own1; n += kConsumers) own[n - own0] = awaitWord(p.residual + n, p.start_flag);
    unsigned piece = 0;
    for (int s = 0; s < steps; ++s) {
        const Kind kind = kindOf(p.m, s);
        const unsigned in = s == 0 ? p.start_flag : flagOf(p, s - 1), out_flag = flagOf(p, s);
        if (cta == 0 && threadIdx.x == 0) p.stamps[s] = now();
        if (kind == kAttention) {
            if (cta < p.m.heads * p.splits) attention(p, s, cta, kv, scratch);
            continue;
        }
        if (kind == kCombine) {
            if (cta == 0 && warp == 0) {
                float best = -INFINITY, row = 0.f;
                for (int c = lane; c < p.ctas; c += 32) {
                    const float v = awaitWord(p.best + 2 * c, in), r = awaitWord(p.best + 2 * c + 1, in);
                    if (v > best || (v == best && r < row)) best = v, row = r;
                }
                for (int o = 16; o > 0; o >>= 1) {
                    const float v = __shfl_xor_sync(0xffffffffu, best, o), r = __shfl_xor_sync(0xffffffffu, row, o);
                    if (v > best || (v == best && r < row)) best = v, row = r;
                }
                if (lane == 0) *p.token = int(row);
            }
            break;
        }
        const Gemv g = gemvOf(p, s);
        if (kind == kQkv || kind == kFc || kind == kLmHead)
            loadNormed(p, x, scratch, in);
        else if (kind == kOut)
            loadAttention(p, x, scratch, in);
        else
            awaitVector(x, p.hidden, g.K, in);
        consumersSync();
        toHalf(x, xh, g.K);
        consumersSync();
        if (cta == 0 && threadIdx.x == 0) p.detail[2 * s] = now();
        const int per = rowsPerPiece(p, g);
        float best = -INFINITY, best_row = 0.f;
        int r, re, before = 0;
        for (int i = 0; pieceRows(p, s, g, per, cta, i, r, re); ++i, ++piece) {
            const unsigned slot = piece % unsigned(p.ring.slots);
            const int rows = re - r, tasks = (rows + 3) / 4;
            mbarWait(full + slot, (piece / unsigned(p.ring.slots)) & 1);
            const __half* W = reinterpret_cast<const __half*>(ring + slot * p.ring.slot_bytes);
            // Tasks of 4 rows go to warps in turn across the step, not from warp 0 in each piece:
            // with a task or two per piece, all warps then work on different pieces at once.
            for (int task = (warp - before % kConsumerWarps + kConsumerWarps) % kConsumerWarps; task < tasks; task += kConsumerWarps) {
                const int n0 = 4 * task, n = min(4, rows - n0);
                float y[4] = {0.f, 0.f, 0.f, 0.f};
                if (p.ring.diagnose != 1 && p.ring.diagnose != 3) dotRows(W + size_t(n0) * g.K, g.K, n, xh, lane, y);
#pragma unroll
                for (int j = 0; j < 4; ++j) y[j] = warpSum(y[j]);
                if (lane == 0)
                    for (int j = 0; j < n; j += g.P) {
                        const int row = r + n0 + j;
                        if (kind == kQkv)
                            storeWord(p.qkv + row, y[j], out_flag);
                        else if (kind == kOut || kind == kDown)
                            storeWord(p.residual + row, own[row - own0] += y[j], out_flag);
                        else if (kind == kFc)
                            storeWord(p.hidden + row / g.P, g.P == 2 ? silu(y[j]) * y[j + 1] : gelu(y[j]), out_flag);
                        else if (y[j] > best)
                            best = y[j], best_row = float(row);
                    }
            }
            before += tasks;
            __syncwarp();
            if (lane == 0) mbarArrive(empty + slot);
        }
        if (cta == 0 && lane == 0) atomicMax(p.detail + 2 * s + 1, now());
        if (kind == kLmHead) {
            if (lane == 0) scratch[warp] = best, scratch[kConsumerWarps + warp] = best_row;
            consumersSync();
            if (threadIdx.x == 0) {
                float b = scratch[0], row = scratch[kConsumerWarps];
                for (int w = 1; w < kConsumerWarps; ++w)
                    if (scratch[w] > b || (scratch[w] == b && scratch[kConsumerWarps + w] < row)) b = scratch[w], row = scratch[kConsumerWarps + w];
                storeWord(p.best + 2 * cta, b, out_flag);
                storeWord(p.best + 2 * cta + 1, row, out_flag);
            }
        }
        consumersSync();  // x and xh are the next step's
    }
    consumersSync();
    if (threadIdx.x == 0) atomicMax(p.span + 1, now());
}

struct Run {
    double step_us[7];  // per kind: from the wait before it to the wait after it, CTA 0, mean
    double input_us[7], rows_us[7];  // of which: the input loaded, then the rows done
    double ms_per_token, span_us, limit_ms;
    bool correct;
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
    p.ring = ring;
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
    auto words = [&](size_t n) {
        Word* w = static_cast<Word*>(alloc(n * 8));
        CHECK(cudaMemset(w, 0, n * 8));
        return w;
    };
    p.residual = words(m.H);
    p.qkv = words(m.qkvRows());
    p.attention = words(size_t(m.heads) * p.splits * (2 + kHeadDim));
    p.hidden = words(m.I);
    p.best = words(2 * size_t(sms));
    p.token = static_cast<int*>(alloc(4));
    const int steps = m.layers * kStepsPerLayer + 2;
    p.span = static_cast<unsigned long long*>(alloc(16));
    p.stamps = static_cast<unsigned long long*>(alloc(steps * 8));
    CHECK(cudaMemset(p.stamps, 0, steps * 8));
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

    const size_t smem = size_t(p.ring.slots) * p.ring.slot_bytes + 2 * kMaxSlots * 8 + kMaxK * 6 + kScratch * 4 + 2 * (kMaxPositions + 1) * kHeadDim * 2 + 64 * 4;
    CHECK(cudaFuncSetAttribute(decodeToken, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decodeToken, kThreads, smem));
    if (per_sm < 1) {
        std::printf("decodeToken does not fit an SM (%zu bytes of shared memory)\n", smem);
        std::exit(1);
    }
    auto launch = [&](bool reset_span) {
        p.start_flag = p.epoch == 0 ? 1u : p.epoch * 256u + unsigned(m.layers * kStepsPerLayer - 1) + 1u;  // the last down's
        ++p.epoch;
        if (reset_span) {
            CHECK(cudaMemsetAsync(p.span, 0xFF, 8));
            CHECK(cudaMemsetAsync(p.span + 1, 0, 8));
        }
        void* args[] = {&p};
        CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(decodeToken), dim3(sms), dim3(kThreads), args, smem, nullptr));
    };
    std::vector<Word> start_words(m.H);
    for (int j = 0; j < m.H; ++j) {
        unsigned bits;
        std::memcpy(&bits, &start[j], 4);
        start_words[j] = (Word(1) << 32) | bits;  // flag 1: the start of the first token
    }
    CHECK(cudaMemcpy(p.residual, start_words.data(), m.H * 8, cudaMemcpyHostToDevice));
    launch(true);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> got(m.H);
    std::vector<Word> got_words(m.H);
    int token = -1;
    CHECK(cudaMemcpy(got_words.data(), p.residual, m.H * 8, cudaMemcpyDeviceToHost));
    for (int j = 0; j < m.H; ++j) {
        const unsigned bits = unsigned(got_words[j]);
        std::memcpy(&got[j], &bits, 4);
    }
    CHECK(cudaMemcpy(&token, p.token, 4, cudaMemcpyDeviceToHost));
    float max_error = 0.f, max_ref = 0.f;
    for (int j = 0; j < m.H; ++j) max_error = std::max(max_error, std::fabs(got[j] - ref_final[j])), max_ref = std::max(max_ref, std::fabs(ref_final[j]));
    max_error /= std::max(max_ref, 1e-6f);
    std::vector<float> sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    const bool tie = sorted[0] - sorted[1] < 1e-2f * std::fabs(sorted[0]);  // products are summed in f16
    const bool correct = max_error < 1e-2f && (token == ref_token || tie);
    std::printf("%s: residual max error %.2e (relative to its largest element), token %d (reference %d%s)\n", m.name, max_error, token, ref_token,
                tie ? ", near tie" : "");

    // Timing: tokens back to back, each a launch.
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; ++i) launch(false);
    std::vector<double> spans, step_sum(7, 0.0);
    std::vector<int> step_count(7, 0);
    std::vector<unsigned long long> st(steps), dt(2 * steps);
    std::vector<double> input_sum(7, 0.0), rows_sum(7, 0.0);
    for (int i = 0; i < tokens; ++i) {
        CHECK(cudaMemsetAsync(p.detail, 0, 2 * steps * 8));
        launch(true);
        unsigned long long s[2];
        CHECK(cudaMemcpy(s, p.span, 16, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(st.data(), p.stamps, st.size() * 8, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(dt.data(), p.detail, dt.size() * 8, cudaMemcpyDeviceToHost));
        spans.push_back((s[1] - s[0]) * 1e-3);
        // Stamp s: CTA 0 begins step s (its input not yet there); step s lasts until stamp s + 1.
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
    r.ms_per_token = ms / tokens, r.span_us = median(spans), r.limit_ms = m.weightBytes() / (gbs * 1e9) * 1e3, r.correct = correct;
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
    bool handoff = false;
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
        else if (!std::strcmp(argv[i], "--handoff")) handoff = true;
        else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) only = argv[++i];
        else {
            std::printf("usage: %s [--tokens N] [--ctx POSITIONS] [--slots N] [--slot-kb KB] [--copy-kb KB] [--lanes-copy] [--contiguous] [--diagnose 1|2|3] [--model gpt2|llama1b] [--handoff]\n", argv[0]);
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
    if (handoff) {
        runHandOff(sms);
        return 0;
    }
    const double gbs = measureBandwidth(sms);
    std::printf("%s, %d SMs, read bandwidth %.0f GB/s, context %d positions, ring %d x %d KB, %s\n", prop.name, sms, gbs, ctx, ring.slots,
                ring.slot_bytes / 1024, ring.lanes_copy ? "lanes copy 16 bytes each (cp.async)" : "copy engine (cp.async.bulk)");
    std::printf("pieces %s, %d consumer warps%s\n", ring.striped ? "striped over CTAs (o, down: contiguous)" : "contiguous per CTA", kConsumerWarps,
                ring.diagnose == 1 ? ", DIAGNOSTIC: no arithmetic" : ring.diagnose == 2 ? ", DIAGNOSTIC: no copies" : ring.diagnose == 3 ? ", DIAGNOSTIC: no copies, no arithmetic" : "");
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
