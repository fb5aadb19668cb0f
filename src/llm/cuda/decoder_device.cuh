// Device helpers shared by the decoder's .cu files: warp/block reductions and programmatic
// dependent launch (PDL) on both sides.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "llm/cuda/decoder_kernels.h"

namespace kiln::llm::cuda {

constexpr int kBlockThreads = 256;

__device__ __forceinline__ float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warpMax(float v) {
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

// Where this translation unit's kernels trace to (decoder_kernels.h, setTraceSink); each
// .cu file has its own copy, set through setTraceSink.
struct TraceSink {
    CtaTraceRecord* records;
    unsigned* used;
    unsigned capacity;
};
static __device__ TraceSink g_trace_sink;
void setAttentionTraceSink(const TraceSink& sink);

__device__ __forceinline__ unsigned long long globalTimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A CTA's entry in the step timeline: made first thing in a kernel, written by thread 0
// when it goes out of scope (the CTA's end) if a sink is set. Whether one is set is read at
// the start, so that the read's latency does not lengthen the CTA's end when tracing is off.
struct CtaTrace {
    unsigned long long start, waited = 0;
    int kind, n, k;
    bool on;
    __device__ CtaTrace(int kind_, int n_, int k_) : start(globalTimer()), kind(kind_), n(n_), k(k_), on(g_trace_sink.records != nullptr) {}
    __device__ ~CtaTrace() {
        if (!on || threadIdx.x != 0) return;
        const TraceSink sink = g_trace_sink;
        const unsigned slot = atomicAdd(sink.used, 1u);
        if (slot < sink.capacity)
            sink.records[slot] = {start, waited, globalTimer(), kind, n, k, int(gridDim.x * gridDim.y * gridDim.z)};
    }
};

// Waits until the kernel this one was launched behind has finished and its writes are
// visible (a no-op when it was launched normally), then lets the next kernel launch. (Letting
// it launch only after attention's loads of keys, so that the output projection's early
// weight loads do not compete with them, measured equal on the H200.)
__device__ __forceinline__ void waitForPredecessor(CtaTrace& trace) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    trace.waited = globalTimer();
}

// Launches kernel<<<grid, block, smem, s>>>(args...), allowed to start before the previous
// kernel on the stream ends when PDL is on (the kernel must call waitForPredecessor first).
template <typename... Params, typename... Args>
void launchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = s;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = programmaticLaunchEnabled() ? 1 : 0;
    cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kiln::llm::cuda
