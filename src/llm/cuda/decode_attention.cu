#include "llm/cuda/paged_attention.cuh"

namespace kiln::llm::cuda {

namespace {

template <int D, int kKeysInFlight>
__global__ void __launch_bounds__(kAttentionThreads) pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale,
                                                                          AttentionScratch scratch, int min_split, __half* out) {
    waitForPredecessor();
    pagedAttentionBlock<D, kKeysInFlight>(blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z, heads, q, m, kv, scale, scratch, min_split, out);
}

}  // namespace

void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, const AttentionScratch& scratch,
                          __half* out, cudaStream_t s) {
    const dim3 grid(heads, T, attentionSplits(T, heads, scratch));
    const int min_split = attentionMinSplit();
    auto run = [&](auto kernel) { launchDependent(kernel, grid, dim3(kAttentionThreads), 0, s, heads, q, m, kv, scale, scratch, min_split, out); };
    const bool eight = attentionEightKeys(T, heads);
    if (kv.head_dim == 64) eight ? run(pagedAttentionKernel<64, 8>) : run(pagedAttentionKernel<64, 4>);
    else eight ? run(pagedAttentionKernel<128, 8>) : run(pagedAttentionKernel<128, 4>);
}

}  // namespace kiln::llm::cuda
