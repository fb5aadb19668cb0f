// Paged attention of the decoder step. One CTA per (query head, token, key split): the keys
// go round-robin to groups of D/8 lanes, each lane holding 16 bytes of q; a group's lanes
// share a key's dot product by shuffles, and each group keeps its own online softmax (max,
// sum, output) over its keys, with the key and value loads of several keys in flight at
// once. The groups then meet in shared memory. When (token, head) pairs are too few to fill
// the GPU (batch-1 decode), the keys split over several CTAs (flash-decoding): each writes
// its max, sum and unnormalized output, and the last to finish combines them.
#include <algorithm>

#include "llm/cuda/decoder_device.cuh"

namespace kiln::llm::cuda {

namespace {

constexpr int kAttentionThreads = 256;
// Below this many keys a split is not worth its combine step (two more dependent trips to
// memory): one CTA's 32 groups take 256 keys in two rounds of loads.
// (KILN_LLM_ATTENTION_MIN_SPLIT changes it for A/B runs.)
constexpr int kMinKeysPerSplit = 256;

// kKeysInFlight: keys per group whose loads are issued together.
template <int D, int kKeysInFlight>
__global__ void __launch_bounds__(kAttentionThreads) pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale,
                                                                          AttentionScratch scratch, int min_split, __half* out) {
    waitForPredecessor();
    constexpr int kLanesPerKey = D / 8, kGroups = kAttentionThreads / kLanesPerKey;
    __shared__ float group_out[kGroups][D + 1];
    __shared__ float group_max[kGroups], group_sum[kGroups];
    __shared__ bool last;
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, splits = gridDim.z;  // splits: for the longest context
    const int g = threadIdx.x % kLanesPerKey, group = threadIdx.x / kLanesPerKey;
    const int kh = h / (heads / kv.kv_heads);
    const int len = m.positions[t] + 1;
    // This split's keys, in whole rounds of kGroups keys and at least kMinKeysPerSplit: a
    // short context stays in one CTA (no combine), splits past the context's end leave.
    const int per_split = max(min_split, ((len + splits - 1) / splits + kGroups - 1) / kGroups * kGroups);
    const int active = (len + per_split - 1) / per_split;
    if (split >= active) return;
    const int begin = split * per_split, end = min(len, begin + per_split);
    const int32_t* table = m.block_tables + int64_t(m.token_chunk[t]) * m.max_blocks;
    float qf[8], acc[8] = {};
    const uint4 qv = *reinterpret_cast<const uint4*>(q + (int64_t(t) * heads + h) * D + g * 8);
    const __half2* qh = reinterpret_cast<const __half2*>(&qv);
    for (int i = 0; i < 4; ++i) qf[2 * i] = __low2float(qh[i]) * scale, qf[2 * i + 1] = __high2float(qh[i]) * scale;
    auto address = [&](int j) { return ((int64_t(table[j / kv.block_size]) * kv.kv_heads + kh) * kv.block_size + j % kv.block_size) * D + g * 8; };
    float run_max = -INFINITY, run_sum = 0.f;
    // Uniform trip counts across the block: the shuffles need whole groups (a group sits in one warp).
    for (int base = begin; base < end; base += kGroups * kKeysInFlight) {
        uint4 kvec[kKeysInFlight], vvec[kKeysInFlight];
#pragma unroll
        for (int u = 0; u < kKeysInFlight; ++u) {
            const int j = base + u * kGroups + group;
            kvec[u] = vvec[u] = make_uint4(0, 0, 0, 0);
            if (j < end) kvec[u] = *reinterpret_cast<const uint4*>(kv.k + address(j)), vvec[u] = *reinterpret_cast<const uint4*>(kv.v + address(j));
        }
#pragma unroll
        for (int u = 0; u < kKeysInFlight; ++u) {
            const __half2* k2 = reinterpret_cast<const __half2*>(&kvec[u]);
            float dot = 0.f;
            for (int i = 0; i < 4; ++i) dot += qf[2 * i] * __low2float(k2[i]) + qf[2 * i + 1] * __high2float(k2[i]);
            for (int o = kLanesPerKey / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (base + u * kGroups + group >= end) continue;
            const float new_max = fmaxf(run_max, dot);
            const float corr = __expf(run_max - new_max), p = __expf(dot - new_max);  // corr 0 on a group's first key
            const __half2* v2 = reinterpret_cast<const __half2*>(&vvec[u]);
            for (int i = 0; i < 4; ++i) acc[2 * i] = acc[2 * i] * corr + p * __low2float(v2[i]), acc[2 * i + 1] = acc[2 * i + 1] * corr + p * __high2float(v2[i]);
            run_sum = run_sum * corr + p, run_max = new_max;
        }
    }
    for (int i = 0; i < 8; ++i) group_out[group][g * 8 + i] = acc[i];
    if (g == 0) group_max[group] = run_max, group_sum[group] = run_sum;
    __syncthreads();
    // Thread d merges the groups' outputs for dimension d (groups without keys have sum 0).
    float top = -INFINITY;
    for (int k = 0; k < kGroups; ++k) top = fmaxf(top, group_max[k]);
    float total = 0.f;
    for (int k = 0; k < kGroups; ++k)
        if (group_sum[k] > 0.f) total += group_sum[k] * __expf(group_max[k] - top);
    float merged = 0.f;
    const int d = threadIdx.x;
    if (d < D)
        for (int k = 0; k < kGroups; ++k)
            if (group_sum[k] > 0.f) merged += group_out[k][d] * __expf(group_max[k] - top);
    __half* dst = out + (int64_t(t) * heads + h) * D;
    if (active == 1) {
        if (d < D) dst[d] = __float2half(merged / total);
        return;
    }
    // Split: publish this split's (max, sum, output), then the pair's last CTA combines.
    const int pair = t * heads + h;
    float* mine = scratch.partials + (int64_t(pair) * kMaxAttentionSplits + split) * (D + 2);
    if (d < D) mine[d] = merged;
    if (threadIdx.x == 0) mine[D] = top, mine[D + 1] = total;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(scratch.counters + pair, 1) == active - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* all = scratch.partials + int64_t(pair) * kMaxAttentionSplits * (D + 2);
    top = -INFINITY;
    for (int s = 0; s < active; ++s) top = fmaxf(top, __ldcg(all + s * (D + 2) + D));
    total = 0.f;
    for (int s = 0; s < active; ++s) {
        const float ssum = __ldcg(all + s * (D + 2) + D + 1);
        if (ssum > 0.f) total += ssum * __expf(__ldcg(all + s * (D + 2) + D) - top);
    }
    if (d < D) {
        float o = 0.f;
        for (int s = 0; s < active; ++s) {
            const float* ps = all + s * (D + 2);
            if (__ldcg(ps + D + 1) > 0.f) o += __ldcg(ps + d) * __expf(__ldcg(ps + D) - top);
        }
        dst[d] = __float2half(o / total);
    }
    if (threadIdx.x == 0) scratch.counters[pair] = 0;  // ready for the next launch
}

}  // namespace

void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, const AttentionScratch& scratch,
                          __half* out, cudaStream_t s) {
    // Enough CTAs for two per SM; the split count depends on T only, so a captured graph
    // stays valid as contexts grow (splits past a short context's end exit at once).
    // (KILN_LLM_ATTENTION_SPLITS caps it for A/B runs.)
    static const int cap = std::clamp(decoderKnob("ATTENTION_SPLITS", kMaxAttentionSplits), 1, kMaxAttentionSplits);
    int splits = 1;
    if (scratch.partials && T * heads <= scratch.capacity) splits = std::clamp((2 * scratch.sms + T * heads - 1) / (T * heads), 1, cap);
    const dim3 grid(heads, T, splits);
    // Keys in flight per group: 8 when few (token, head) pairs leave the GPU latency-bound
    // (GPT-2's 12 heads at batch 1: 0.358 -> 0.349 ms/token on the H200; Llama-1.1B's 32:
    // 0.952 -> 0.959, so 4 there). KILN_LLM_ATTENTION_KEYS=4 or 8 forces one.
    static const int forced = decoderKnob("ATTENTION_KEYS", 0);
    const bool eight = forced ? forced == 8 : T * heads <= 16;
    static const int min_split = std::max(32, decoderKnob("ATTENTION_MIN_SPLIT", kMinKeysPerSplit));
    auto run = [&](auto kernel) { launchDependent(kernel, grid, dim3(kAttentionThreads), 0, s, heads, q, m, kv, scale, scratch, min_split, out); };
    if (kv.head_dim == 64) eight ? run(pagedAttentionKernel<64, 8>) : run(pagedAttentionKernel<64, 4>);
    else eight ? run(pagedAttentionKernel<128, 8>) : run(pagedAttentionKernel<128, 4>);
}

}  // namespace kiln::llm::cuda
