#include "llm/cuda/decoder_kernels.h"

#include <math.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "llm/cuda/small_gemm.cuh"

namespace kiln::llm::cuda {

namespace {

__global__ void embedKernel(int T, int H, StepMeta m, const __half* wte, const __half* wpe, float* x) {
    embedRows(blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, T, H, m, wte, wpe, x);
}

__global__ void addNormKernel(int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                              float eps, bool rms, __half* out) {
    waitForPredecessor();
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

template <int R, int P>
__global__ void __launch_bounds__(kBlockThreads) smallGemmKernel(int rows, int N, int K, const __half* W, SmallGemmInput in, SmallGemmOutput out,
                                                                  bool evict_first) {
    extern __shared__ __align__(16) __half xs[];  // [rows][K]
    smallGemmBlock<R, P>(blockIdx.x, gridDim.x, rows, N, K, W, in, out, xs, evict_first, [] { waitForPredecessor(); });
}

__global__ void qkvToCacheKernel(const __half* qkv, QkvDestination d) {
    waitForPredecessor();
    // One CTA per (token, head of q|k|v); thread i owns the pair (i, i + half), stored at
    // columns h*D + 2i and h*D + 2i + 1 of the interleaved row.
    const int t = blockIdx.x, h = blockIdx.y, D = d.kv.head_dim, half = D / 2;
    const int width = (d.heads + 2 * d.kv.kv_heads) * D;
    const __half* row = qkv + int64_t(t) * width + h * D;
    for (int i = threadIdx.x; i < half; i += blockDim.x) storeQkvPair(d, t, h, i, __half2float(row[2 * i]), __half2float(row[2 * i + 1]));
}

__global__ void mlpActivationKernel(int I, const __half* in, const __half* bias, bool swiglu, __half* out) {
    waitForPredecessor();
    const int t = blockIdx.y;
    const __half* row = in + int64_t(t) * (swiglu ? 2 * I : I);
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += gridDim.x * blockDim.x) {
        const float v = swiglu ? silu(__half2float(row[2 * j])) * __half2float(row[2 * j + 1])
                               : geluTanh(__half2float(row[j]) + (bias ? __half2float(bias[j]) : 0.f));
        out[int64_t(t) * I + j] = __float2half(v);
    }
}

__global__ void argmaxKernel(int n, const float* x, int32_t* ids) {
    waitForPredecessor();
    argmaxBlock(blockIdx.x, n, x, ids);
}

// A resident wave of blocks: as many as fit on each SM at this shared-memory size, or
// fewer (KILN_LLM_GEMV_CTAS_PER_SM, for A/B runs: one per SM was 20% slower on the H200;
// building for three per SM, fewer registers, gained nothing); the warps stride over the tasks.
template <int R, int P>
void launchSmallGemmRows(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int sms, cudaStream_t s) {
    static const int cap = decoderKnob("GEMV_CTAS_PER_SM", 0);
    // Evict-first weight loads: batch-1 decode on the H200 0.340 -> 0.309 ms/token (GPT-2),
    // 0.943 -> 0.914 (Llama-1.1B). KILN_LLM_WEIGHTS_EVICT_FIRST=0 turns them off.
    static const bool evict_first = decoderKnob("WEIGHTS_EVICT_FIRST", 1) != 0;
    const int warps = kBlockThreads / 32, tasks = N / P;
    const size_t smem = size_t(rows) * K * 2;
    int per_sm = 1;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, smallGemmKernel<R, P>, kBlockThreads, smem);
    per_sm = std::max(per_sm, 1);
    if (cap > 0) per_sm = std::min(per_sm, cap);
    const int blocks = std::min((tasks + warps - 1) / warps, per_sm * sms);
    launchDependent(smallGemmKernel<R, P>, dim3(blocks), dim3(kBlockThreads), smem, s, rows, N, K, W, in, out, evict_first);
}

template <int P>
void launchSmallGemmPairs(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int sms, cudaStream_t s) {
    if (rows == 1) launchSmallGemmRows<1, P>(rows, N, K, W, in, out, sms, s);
    else if (rows == 2) launchSmallGemmRows<2, P>(rows, N, K, W, in, out, sms, s);
    else launchSmallGemmRows<4, P>(rows, N, K, W, in, out, sms, s);
}

template <int P>
bool allowSmallGemmSmem(int bytes) {
    return cudaFuncSetAttribute(smallGemmKernel<1, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
           cudaFuncSetAttribute(smallGemmKernel<2, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess &&
           cudaFuncSetAttribute(smallGemmKernel<4, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

}  // namespace

bool programmaticLaunchEnabled() {
    static const bool on = [] {
        const char* env = std::getenv("KILN_LLM_PDL");
        int device = 0, major = 0;
        if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
        return major >= 9 && !(env && std::string(env) == "0");
    }();
    return on;
}

void launchEmbed(int T, int H, const StepMeta& m, const __half* wte, const __half* wpe, float* x, cudaStream_t s) {
    embedKernel<<<T, 256, 0, s>>>(T, H, m, wte, wpe, x);  // after the metadata copy: launched normally
}

void launchAddNorm(int rows, int H, const int32_t* row_map, float* x, const __half* add, const __half* add_bias, const float* w, const float* b,
                   float eps, bool rms, __half* out, cudaStream_t s) {
    launchDependent(addNormKernel, dim3(rows), dim3(kBlockThreads), 0, s, H, row_map, x, add, add_bias, w, b, eps, rms, out);
}

void launchQkvToCache(int T, const __half* qkv, const QkvDestination& d, cudaStream_t s) {
    launchDependent(qkvToCacheKernel, dim3(T, d.heads + 2 * d.kv.kv_heads), dim3(d.kv.head_dim / 2), 0, s, qkv, d);
}

bool prepareSmallGemm(int max_k) {
    const int bytes = kSmallGemmMaxRows * max_k * 2;
    int device = 0, optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return false;
    if (bytes + 1024 > optin) return false;
    return allowSmallGemmSmem<1>(bytes) && allowSmallGemmSmem<2>(bytes);
}

void launchSmallGemm(int rows, int N, int K, const __half* W, const SmallGemmInput& in, const SmallGemmOutput& out, int sms, cudaStream_t s) {
    if (out.kind == SmallGemmOutput::SwiGlu || out.kind == SmallGemmOutput::Qkv) launchSmallGemmPairs<2>(rows, N, K, W, in, out, sms, s);
    else launchSmallGemmPairs<1>(rows, N, K, W, in, out, sms, s);
}

void launchArgmax(int rows, int n, const float* x, int32_t* ids, cudaStream_t s) {
    launchDependent(argmaxKernel, dim3(rows), dim3(1024), 0, s, n, x, ids);
}

void launchMlpActivation(int T, int I, const __half* in, const __half* bias, bool swiglu, __half* out, cudaStream_t s) {
    launchDependent(mlpActivationKernel, dim3((I + 255) / 256, T), dim3(256), 0, s, I, in, bias, swiglu, out);
}

}  // namespace kiln::llm::cuda
