// How fast can a batch-1 decode GEMV stream its weights from HBM? For the Llama-1.1B shapes
// it streams y = W x (W f16 [N][K], x one row) the way the decoder's small GEMM does (a warp
// per task of P rows, 16-byte loads, chunks of U loads per lane and row, DEPTH chunks in
// flight per warp in registers) at 1-2 CTAs per SM, next to a plain read of the same bytes.
// Every launch reads a different copy of the weights (the copies together are several times
// the L2), as a decode step does. Reported per kernel: the span from the first CTA's start to
// the last CTA's end (%globaltimer, launch gaps excluded), median of the launches, in us and
// GB/s.
// Build: nvcc -O3 -std=c++17 -arch=sm_90 bench/gemv_stream_bench.cu -o gemv_stream_bench
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_bench_check.cuh"

// span[0] = min CTA start, span[1] = max CTA end, per launch.
__device__ __forceinline__ void noteStart(unsigned long long* span, unsigned long long t) {
    if (threadIdx.x == 0) atomicMin(span, t);
}
__device__ __forceinline__ void noteEnd(unsigned long long* span) {
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(span + 1, now());
}

__device__ __forceinline__ uint4 load(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// How a chunk's 16-byte pieces meet x: kFma, f32 products and sums (the decoder's way);
// kXor, no arithmetic (the stream alone); kHalf2, f16 products summed in pairs then in f32;
// kFloatX, f32 products with x kept in shared memory as f32 (no conversions of x).
enum Mode { kFma, kXor, kHalf2, kFloatX };

// y = W x; this warp's chunks in order, DEPTH of them in flight (a ring in registers).
template <int P, int U, int DEPTH, int MODE>
__global__ void __launch_bounds__(256) streamGemv(int N, int K, const __half* W, const __half* x, float* y, unsigned long long* span) {
    const unsigned long long t0 = now();
    extern __shared__ __align__(16) __half xs[];
    float* xf32 = reinterpret_cast<float*>(xs);
    const int lane = threadIdx.x % 32, warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, warps = gridDim.x * (blockDim.x / 32);
    const int K8 = K / 8, chunks = (K8 + 32 * U - 1) / (32 * U), tasks = N / P;
    const int my_tasks = tasks > warp ? (tasks - warp + warps - 1) / warps : 0, total = my_tasks * chunks;
    auto loadChunk = [&](uint4(&w)[P][U], int i) {
        const int task = warp + i / chunks * warps, chunk = i % chunks;
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (chunk * U + u) * 32 + lane;
                w[p][u] = k < K8 ? load(reinterpret_cast<const uint4*>(W + (int64_t(task) * P + p) * K) + k) : make_uint4(0, 0, 0, 0);
            }
    };
    uint4 ring[DEPTH][P][U];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
        if (d < total) loadChunk(ring[d], d);
    if (MODE == kFloatX)
        for (int j = threadIdx.x; j < K; j += blockDim.x) xf32[j] = __half2float(x[j]);
    else
        for (int j = threadIdx.x; j < K8; j += blockDim.x) reinterpret_cast<uint4*>(xs)[j] = reinterpret_cast<const uint4*>(x)[j];
    __syncthreads();
    noteStart(span, t0);
    float acc[P] = {};
    unsigned bits[P] = {};
    for (int base = 0; base < total; base += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            const int i = base + d;
            if (i >= total) break;
            const int chunk = i % chunks;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = (chunk * U + u) * 32 + lane;
                if (k >= K8) break;
                if constexpr (MODE == kXor) {
#pragma unroll
                    for (int p = 0; p < P; ++p) bits[p] ^= ring[d][p][u].x ^ ring[d][p][u].y ^ ring[d][p][u].z ^ ring[d][p][u].w;
                    continue;
                }
                if constexpr (MODE == kFloatX) {
                    const float4 xa = reinterpret_cast<const float4*>(xf32)[2 * k], xb = reinterpret_cast<const float4*>(xf32)[2 * k + 1];
                    const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        const __half2* w2 = reinterpret_cast<const __half2*>(&ring[d][p][u]);
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const float2 wf = __half22float2(w2[q]);
                            acc[p] += wf.x * xv[2 * q] + wf.y * xv[2 * q + 1];
                        }
                    }
                    continue;
                }
                const uint4 xv = reinterpret_cast<const uint4*>(xs)[k];
                const __half2* x2 = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    const __half2* w2 = reinterpret_cast<const __half2*>(&ring[d][p][u]);
                    if constexpr (MODE == kHalf2) {
                        __half2 s2 = __hmul2(w2[0], x2[0]);
                        s2 = __hfma2(w2[1], x2[1], s2);
                        const float2 a = __half22float2(s2);
                        __half2 t2 = __hmul2(w2[2], x2[2]);
                        t2 = __hfma2(w2[3], x2[3], t2);
                        const float2 b = __half22float2(t2);
                        acc[p] += (a.x + a.y) + (b.x + b.y);
                    } else {
#pragma unroll
                        for (int q = 0; q < 4; ++q) {
                            const float2 wf = __half22float2(w2[q]), xf = __half22float2(x2[q]);
                            acc[p] += wf.x * xf.x + wf.y * xf.y;
                        }
                    }
                }
            }
            if (chunk == chunks - 1) {
                const int task = warp + i / chunks * warps;
#pragma unroll
                for (int p = 0; p < P; ++p) {
                    float s = acc[p] + float(bits[p] & 1u);
                    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                    if (lane == 0) y[task * P + p] = s;
                    acc[p] = 0.f;
                }
            }
            if (i + DEPTH < total) loadChunk(ring[d], i + DEPTH);
        }
    }
    noteEnd(span);
}

// The weight stream of a tensor-core GEMV, without the arithmetic (xor): a warp per tile of
// 8 rows x K, its lanes in ROWS groups (one row each) of 32 / ROWS lanes, so that one load
// instruction reads ROWS rows x (32 / ROWS) x 16 bytes: 8 x 64 bytes is the mma fragment
// order loaded straight from memory, 4 x 128 what a shared-memory stage read back by
// ldmatrix would allow. Chunks of 8 loads per lane, two in flight.
template <int ROWS>
__global__ void __launch_bounds__(256) tileStream(int N, int K, const __half* W, float* y, unsigned long long* span) {
    const unsigned long long t0 = now();
    constexpr int kLanesPerRow = 32 / ROWS, kTileRows = 8, kLoads = 8;
    const int lane = threadIdx.x % 32, warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, warps = gridDim.x * (blockDim.x / 32);
    const int K8 = K / 8, group = lane / kLanesPerRow, sub = lane % kLanesPerRow;
    // A chunk covers kLoads pieces per lane: rows group + ROWS * j (j < 8 / ROWS) in turn.
    constexpr int kPasses = kTileRows / ROWS, kPiecesPerPass = kLoads / kPasses;
    const int chunks = (K8 + kLanesPerRow * kPiecesPerPass - 1) / (kLanesPerRow * kPiecesPerPass), tiles = N / kTileRows;
    const int my_tiles = tiles > warp ? (tiles - warp + warps - 1) / warps : 0, total = my_tiles * chunks;
    auto loadChunk = [&](uint4(&w)[kLoads], int i) {
        const int tile = warp + i / chunks * warps, chunk = i % chunks;
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
            const int row = tile * kTileRows + group + ROWS * (u / kPiecesPerPass);
            const int piece = (chunk * kPiecesPerPass + u % kPiecesPerPass) * kLanesPerRow + sub;
            w[u] = piece < K8 ? load(reinterpret_cast<const uint4*>(W + int64_t(row) * K) + piece) : make_uint4(0, 0, 0, 0);
        }
    };
    uint4 a[kLoads], b[kLoads];
    if (total > 0) loadChunk(a, 0);
    if (total > 1) loadChunk(b, 1);
    noteStart(span, t0);
    unsigned bits = 0;
    auto use = [&](uint4(&w)[kLoads], int i) {
#pragma unroll
        for (int u = 0; u < kLoads; ++u) bits ^= w[u].x ^ w[u].y ^ w[u].z ^ w[u].w;
        if (i + 2 < total) loadChunk(w, i + 2);
    };
    for (int i = 0; i < total; i += 2) {
        use(a, i);
        if (i + 1 < total) use(b, i + 1);
    }
    if (bits == 0x12345678u) y[0] = 1.f;
    noteEnd(span);
}

// Reads n uint4 (grid-stride), IN loads in flight per thread; the xor keeps the loads live.
template <int IN>
__global__ void readAll(const uint4* src, size_t n, unsigned* sink, unsigned long long* span) {
    noteStart(span, now());
    unsigned x = 0;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += IN * stride) {
        uint4 v[IN];
#pragma unroll
        for (int u = 0; u < IN; ++u) v[u] = i + u * stride < n ? load(src + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < IN; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x12345678u) *sink = x;
    noteEnd(span);
}

constexpr int kReps = 40;
constexpr size_t kPoolBytes = size_t(4) << 30;  // copies of the weights: 4 GB, many times the 50 MB L2

struct Bench {
    char* pool;
    unsigned long long* spans;  // [kReps][2]
    std::vector<unsigned long long> host = std::vector<unsigned long long>(2 * kReps);
};

// Median span in us of kReps launches, launch(r, copy) reading copy r of `bytes`.
template <class Launch>
double medianSpan(Bench& b, size_t bytes, Launch launch) {
    std::vector<unsigned long long> init(2 * kReps);
    for (int r = 0; r < kReps; ++r) init[2 * r] = ~0ull, init[2 * r + 1] = 0;
    cudaMemcpy(b.spans, init.data(), init.size() * 8, cudaMemcpyHostToDevice);
    const size_t stride = (bytes + 4095) / 4096 * 4096, copies = kPoolBytes / stride;
    for (int r = 0; r < kReps; ++r) launch(b.pool + (r % copies) * stride, b.spans + 2 * r);
    cudaMemcpy(b.host.data(), b.spans, b.host.size() * 8, cudaMemcpyDeviceToHost);
    std::vector<double> us;
    for (int r = 2; r < kReps; ++r) us.push_back((b.host[2 * r + 1] - b.host[2 * r]) * 1e-3);
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

template <int P, int U, int DEPTH, int MODE = kFma>
int runGemv(Bench& b, const char* name, int N, int K, const __half* x, float* y, int sms) {
    const size_t smem = size_t(K) * (MODE == kFloatX ? 4 : 2);
    CHECK(cudaFuncSetAttribute(streamGemv<P, U, DEPTH, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, streamGemv<P, U, DEPTH, MODE>, 256, smem));
    cudaFuncAttributes attr{};
    CHECK(cudaFuncGetAttributes(&attr, streamGemv<P, U, DEPTH, MODE>));
    const size_t bytes = size_t(N) * K * 2;
    for (int ctas = 1; ctas <= std::min(per_sm, 3); ++ctas) {
        const int grid = std::min(ctas * sms, (N / P + 7) / 8);
        const double us = medianSpan(b, bytes, [&](char* w, unsigned long long* span) {
            streamGemv<P, U, DEPTH, MODE><<<grid, 256, smem>>>(N, K, reinterpret_cast<const __half*>(w), x, y, span);
        });
        CHECK(cudaGetLastError());
        const int warps = grid * 8, tasks = N / P;
        static const char* modes[] = {"fma", "xor", "half2", "f32 x"};
        std::printf("%-8s %-5s P %d U %d depth %d regs %3d CTAs/SM %d  tasks/warp %.2f (max %d)  %6.2f us %5.0f GB/s  (%3.0f KB in flight/SM)\n", name, modes[MODE], P, U,
                    DEPTH, attr.numRegs, ctas, double(tasks) / warps, (tasks + warps - 1) / warps, us, bytes / (us * 1e-6) / 1e9,
                    double(ctas) * 8 * DEPTH * P * U * 512 / 1024);
    }
    return 0;
}

template <int ROWS>
int runTiles(Bench& b, const char* name, int N, int K, float* y, int sms) {
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tileStream<ROWS>, 256, 0));
    const size_t bytes = size_t(N) * K * 2;
    for (int ctas = 1; ctas <= std::min(per_sm, 2); ++ctas) {
        const int grid = std::min(ctas * sms, (N / 8 + 7) / 8);
        const double us = medianSpan(b, bytes, [&](char* w, unsigned long long* span) {
            tileStream<ROWS><<<grid, 256>>>(N, K, reinterpret_cast<const __half*>(w), y, span);
        });
        CHECK(cudaGetLastError());
        std::printf("%-8s xor   tiles of 8 rows, %d rows x %3d B per load  CTAs/SM %d  tiles/warp %.2f  %6.2f us %5.0f GB/s\n", name, ROWS, 512 / ROWS, ctas,
                    double(N / 8) / (grid * 8), us, bytes / (us * 1e-6) / 1e9);
    }
    return 0;
}

template <int IN>
int runRead(Bench& b, double mb, int ctas_per_sm, int sms, unsigned* sink) {
    const size_t n = size_t(mb * 1e6) / 16, bytes = n * 16;
    const double us = medianSpan(b, bytes, [&](char* w, unsigned long long* span) {
        readAll<IN><<<sms * ctas_per_sm, 256>>>(reinterpret_cast<const uint4*>(w), n, sink, span);
    });
    CHECK(cudaGetLastError());
    std::printf("read %5.1f MB  %2d loads/thread  %d CTAs/SM  %6.2f us %5.0f GB/s\n", mb, IN, ctas_per_sm, us, bytes / (us * 1e-6) / 1e9);
    return 0;
}

int main() {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Bench b{};
    __half* x = nullptr;
    float* y = nullptr;
    unsigned* sink = nullptr;
    CHECK(cudaMalloc(&b.pool, kPoolBytes));
    CHECK(cudaMalloc(&b.spans, 2 * kReps * 8));
    CHECK(cudaMalloc(&x, 16384 * 2));
    CHECK(cudaMalloc(&y, 16384 * 4 * 4));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(b.pool, 0x3c, kPoolBytes));  // halves of about 1
    CHECK(cudaMemset(x, 0x3c, 16384 * 2));
    // A plain read at the sizes of the decode GEMVs and a large one (the sustained rate).
    for (double mb : {8.4, 10.5, 23.1, 46.1, 400.0}) {
        if (runRead<4>(b, mb, 4, sms, sink) || runRead<8>(b, mb, 4, sms, sink) || runRead<16>(b, mb, 2, sms, sink))
            return 1;
    }
    struct Shape {
        const char* name;
        int N, K;
    };
    for (const Shape s : {Shape{"gate|up", 11264, 2048}, Shape{"down", 2048, 5632}, Shape{"qkv", 2560, 2048}, Shape{"o", 2048, 2048}}) {
        if (runTiles<8>(b, s.name, s.N, s.K, y, sms) || runTiles<4>(b, s.name, s.N, s.K, y, sms) || runGemv<2, 4, 2>(b, s.name, s.N, s.K, x, y, sms) || runGemv<2, 4, 2, kXor>(b, s.name, s.N, s.K, x, y, sms) ||
            runGemv<2, 4, 2, kHalf2>(b, s.name, s.N, s.K, x, y, sms) || runGemv<2, 4, 2, kFloatX>(b, s.name, s.N, s.K, x, y, sms) ||
            runGemv<1, 8, 2>(b, s.name, s.N, s.K, x, y, sms) || runGemv<1, 8, 2, kXor>(b, s.name, s.N, s.K, x, y, sms) ||
            runGemv<1, 8, 3>(b, s.name, s.N, s.K, x, y, sms) || runGemv<1, 8, 3, kXor>(b, s.name, s.N, s.K, x, y, sms) ||
            runGemv<1, 8, 3, kHalf2>(b, s.name, s.N, s.K, x, y, sms))
            return 1;
    }
    return 0;
}
