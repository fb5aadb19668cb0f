// The persistent decode step (decoder_kernels.h): the phases of a step in one cooperative
// kernel, separated by a grid-wide barrier.
#include "llm/cuda/decoder_kernels.h"
#include "llm/cuda/paged_attention.cuh"
#include "llm/cuda/small_gemm.cuh"

namespace kiln::llm::cuda {

namespace {

__device__ __forceinline__ unsigned loadAcquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// A barrier over all blocks of the grid (all resident): state[0] counts arrivals, state[1]
// is the generation the last arrival advances. Writes before sync() are visible to every
// block after it. Only thread 0 of a block tracks the generation.
class GridBarrier {
public:
    __device__ explicit GridBarrier(unsigned* state) : state_(state) {
        if (threadIdx.x == 0) generation_ = loadAcquire(state_ + 1);
    }
    __device__ void sync() {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            if (atomicAdd(state_, 1) == gridDim.x - 1) {
                atomicExch(state_, 0);  // before the release: nobody arrives at the next one until then
                __threadfence();
                atomicAdd(state_ + 1, 1);
            } else {
                while (loadAcquire(state_ + 1) == generation_) {
                }
            }
            ++generation_;
            __threadfence();
        }
        __syncthreads();
    }

private:
    unsigned* state_;
    unsigned generation_ = 0;
};

// Each phase kind is its own function, not inlined into the loop: inlined together they
// needed 226 registers (the phase fields come from memory, not the parameter bank), one
// block per SM; apart each fits the two blocks per SM that launch_bounds asks for.
template <int R, int P>
__device__ __noinline__ void gemvPhase(const StepPhase& ph, bool first, GridBarrier& barrier, __half* xs) {
    smallGemmBlock<R, P>(blockIdx.x, gridDim.x, ph.rows, ph.N, ph.K, ph.W, ph.in, ph.out, xs, [&] {
        prefetchToL2(ph.prefetch);
        if (!first) barrier.sync();
    });
}

template <int D>
__device__ __noinline__ void attentionPhase(const PersistentStep& p, const StepPhase& ph, GridBarrier& barrier, int splits, int min_split, bool eight_keys) {
    prefetchToL2(ph.prefetch);
    barrier.sync();
    const int items = p.heads * p.T * splits;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const int h = item % p.heads, t = item / p.heads % p.T, split = item / (p.heads * p.T);
        if (eight_keys) pagedAttentionBlock<D, 8>(h, t, split, splits, p.heads, ph.q, p.meta, ph.kv, p.scale, p.scratch, min_split, ph.att);
        else pagedAttentionBlock<D, 4>(h, t, split, splits, p.heads, ph.q, p.meta, ph.kv, p.scale, p.scratch, min_split, ph.att);
    }
}

template <int R, int D>
__global__ void __launch_bounds__(kBlockThreads, 2) persistentStepKernel(const __grid_constant__ PersistentStep p, int splits, int min_split, bool eight_keys) {
    extern __shared__ __align__(16) __half xs[];  // the GEMV phases' input rows
    GridBarrier barrier(p.barrier);
    for (int i = 0; i < p.count; ++i) {
        const StepPhase& ph = p.phases[i];
        switch (ph.kind) {
            case StepPhase::Embed:
                if (i > 0) barrier.sync();
                embedRows(blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, p.T, ph.K, p.meta, ph.wte, ph.wpe, ph.x);
                break;
            case StepPhase::Gemv:
                if (ph.out.kind == SmallGemmOutput::SwiGlu || ph.out.kind == SmallGemmOutput::Qkv) gemvPhase<R, 2>(ph, i == 0, barrier, xs);
                else gemvPhase<R, 1>(ph, i == 0, barrier, xs);
                break;
            case StepPhase::Attention:
                attentionPhase<D>(p, ph, barrier, splits, min_split, eight_keys);
                break;
            case StepPhase::Argmax:
                barrier.sync();
                for (int r = blockIdx.x; r < ph.rows; r += gridDim.x) argmaxBlock(r, ph.N, ph.values, ph.ids);
                break;
        }
    }
}

template <int R, int D>
bool allowSmem(int bytes) {
    return cudaFuncSetAttribute(persistentStepKernel<R, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
}

template <int R, int D>
bool launch(const PersistentStep& step, int max_k, int sms, cudaStream_t s) {
    const size_t smem = size_t(R) * max_k * 2;
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistentStepKernel<R, D>, kBlockThreads, smem) != cudaSuccess || per_sm < 1) return false;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(per_sm * sms);
    config.blockDim = dim3(kBlockThreads);
    config.dynamicSmemBytes = smem;
    config.stream = s;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;  // all blocks resident, or no launch
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    const int splits = attentionSplits(step.T, step.heads, step.scratch);
    return cudaLaunchKernelEx(&config, persistentStepKernel<R, D>, step, splits, attentionMinSplit(), attentionEightKeys(step.T, step.heads)) ==
           cudaSuccess;
}

template <int D>
bool launchRows(const PersistentStep& step, int max_k, int sms, cudaStream_t s) {
    if (step.T == 1) return launch<1, D>(step, max_k, sms, s);
    if (step.T == 2) return launch<2, D>(step, max_k, sms, s);
    return launch<4, D>(step, max_k, sms, s);
}

}  // namespace

bool preparePersistentStep(int max_k) {
    const int bytes = kSmallGemmMaxRows * max_k * 2;
    return allowSmem<1, 64>(bytes) && allowSmem<2, 64>(bytes) && allowSmem<4, 64>(bytes) && allowSmem<1, 128>(bytes) && allowSmem<2, 128>(bytes) &&
           allowSmem<4, 128>(bytes);
}

bool launchPersistentStep(const PersistentStep& step, int head_dim, int max_k, int sms, cudaStream_t s) {
    if (step.T < 1 || step.T > kSmallGemmMaxRows) return false;
    return head_dim == 64 ? launchRows<64>(step, max_k, sms, s) : launchRows<128>(step, max_k, sms, s);
}

}  // namespace kiln::llm::cuda
