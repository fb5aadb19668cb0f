// Paged attention of the decoder step. One CTA per (query head, token, key split): the keys
// go round-robin to groups of D/8 lanes, each lane holding 16 bytes of q; a group's lanes
// share a key's dot product by shuffles, and each group keeps its own online softmax (max,
// sum, output) over its keys, with the key and value loads of several keys in flight at
// once and one rescale per round. The groups of a warp then meet by shuffles, the warps in
// shared memory. The first round's cached keys load before waiting for the kernel that
// writes q (programmatic dependent launch), so they overlap its tail. When (token, head)
// pairs are too few to fill the GPU (batch-1 decode), the keys split over several CTAs
// (flash-decoding): each writes its max, sum and unnormalized output, and the last to
// finish combines them.
#include <algorithm>

#include "llm/cuda/decoder_device.cuh"

namespace kiln::llm::cuda {

namespace {

constexpr int kAttentionThreads = 256;
// Below this many keys a split is not worth its combine step (two more dependent trips to
// memory): one CTA's 32 groups take 256 keys (D = 64) in one round of loads.
// (llm.cuda.attention_min_split changes it.)
constexpr int kMinKeysPerSplit = 256;
static_assert(DecoderKnobs{}.attention_min_split == kMinKeysPerSplit);

// Keys of token t from here on are written by this step (from its chunk's first position).
__device__ __forceinline__ int freshFrom(const StepMeta& m, int t) {
    const int chunk = m.token_chunk[t];
    return m.positions[chunk == 0 ? 0 : m.last_token[chunk - 1] + 1];
}

// What one CTA's attention over a key range leaves to thread d < D: the range's max score,
// its sum of exponentials and the unnormalized output of dimension d.
struct RangeResult {
    float top, total, merged;
};

// Softmax(q k^T) v of query head h, token t, over keys [begin, end) by one CTA (kKeys keys
// per group in one round of loads, all issued together). Keys before `fresh` were cached by
// earlier steps: the first round's load before the wait for the kernel that writes q and this
// step's keys; the rest after it.
template <int D, int kKeys>
__device__ RangeResult attendRange(int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, int h, int t, int begin, int end,
                                   int fresh, CtaTrace& trace) {
    constexpr int kLanesPerKey = D / 8, kGroups = kAttentionThreads / kLanesPerKey, kWarps = kAttentionThreads / 32;
    __shared__ float warp_out[kWarps][D];
    __shared__ float warp_max[kWarps], warp_sum[kWarps];
    const int g = threadIdx.x % kLanesPerKey, group = threadIdx.x / kLanesPerKey, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int kh = h / (heads / kv.kv_heads);
    const int32_t* table = m.block_tables + int64_t(m.token_chunk[t]) * m.max_blocks;
    auto address = [&](int j) { return ((int64_t(table[j / kv.block_size]) * kv.kv_heads + kh) * kv.block_size + j % kv.block_size) * D + g * 8; };
    uint4 kvec[kKeys], vvec[kKeys];
    // Loads this group's keys [from, to) of the round at base.
    auto loadRound = [&](int base, int from, int to) {
#pragma unroll
        for (int u = 0; u < kKeys; ++u) {
            const int j = base + u * kGroups + group;
            if (j >= from && j < to) kvec[u] = *reinterpret_cast<const uint4*>(kv.k + address(j)), vvec[u] = *reinterpret_cast<const uint4*>(kv.v + address(j));
        }
    };
    for (int u = 0; u < kKeys; ++u) kvec[u] = vvec[u] = make_uint4(0, 0, 0, 0);
    loadRound(begin, begin, min(end, fresh));
    // The first round's keys written by this step: their places (block table reads) found
    // before the wait too, so that after it only the key and value loads remain.
    int64_t fresh_at[kKeys];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
        const int j = begin + u * kGroups + group;
        fresh_at[u] = j >= max(begin, fresh) && j < end ? address(j) : -1;
    }
    waitForPredecessor(trace);
#pragma unroll
    for (int u = 0; u < kKeys; ++u)
        if (fresh_at[u] >= 0) kvec[u] = *reinterpret_cast<const uint4*>(kv.k + fresh_at[u]), vvec[u] = *reinterpret_cast<const uint4*>(kv.v + fresh_at[u]);
    float qf[8], acc[8] = {};
    const uint4 qv = *reinterpret_cast<const uint4*>(q + (int64_t(t) * heads + h) * D + g * 8);
    const __half2* qh = reinterpret_cast<const __half2*>(&qv);
    for (int i = 0; i < 4; ++i) qf[2 * i] = __low2float(qh[i]) * scale, qf[2 * i + 1] = __high2float(qh[i]) * scale;
    float run_max = -INFINITY, run_sum = 0.f;
    // Uniform trip counts across the block: the shuffles need whole groups (a group sits in one warp).
    for (int base = begin; base < end; base += kGroups * kKeys) {
        if (base != begin) {  // the first round is loaded above
            for (int u = 0; u < kKeys; ++u) kvec[u] = vvec[u] = make_uint4(0, 0, 0, 0);
            loadRound(base, base, end);
        }
        // The round's scores first, then one rescale for all of them: the keys' softmax
        // steps do not wait on each other.
        float dot[kKeys];
        float top = run_max;
#pragma unroll
        for (int u = 0; u < kKeys; ++u) {
            const __half2* k2 = reinterpret_cast<const __half2*>(&kvec[u]);
            float d = 0.f;
            for (int i = 0; i < 4; ++i) d += qf[2 * i] * __low2float(k2[i]) + qf[2 * i + 1] * __high2float(k2[i]);
            for (int o = kLanesPerKey / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            dot[u] = base + u * kGroups + group < end ? d : -INFINITY;
            top = fmaxf(top, dot[u]);
        }
        if (top == -INFINITY) continue;  // no key for this group yet
        const float corr = __expf(run_max - top);  // 0 before the group's first key
        run_sum *= corr;
        for (int i = 0; i < 8; ++i) acc[i] *= corr;
#pragma unroll
        for (int u = 0; u < kKeys; ++u) {
            const float p = __expf(dot[u] - top);  // 0 past the end
            const __half2* v2 = reinterpret_cast<const __half2*>(&vvec[u]);
            for (int i = 0; i < 4; ++i) acc[2 * i] += p * __low2float(v2[i]), acc[2 * i + 1] += p * __high2float(v2[i]);
            run_sum += p;
        }
        run_max = top;
    }
    // The groups of a warp meet by shuffles (lanes kLanesPerKey apart hold the same
    // dimensions), then the warps in shared memory. A side without keys has max -inf, sum 0.
    auto weight = [](float mx, float top) { return mx == -INFINITY ? 0.f : __expf(mx - top); };
    for (int o = kLanesPerKey; o < 32; o <<= 1) {
        const float other_max = __shfl_xor_sync(0xffffffffu, run_max, o), other_sum = __shfl_xor_sync(0xffffffffu, run_sum, o);
        const float top = fmaxf(run_max, other_max), mine = weight(run_max, top), theirs = weight(other_max, top);
        for (int i = 0; i < 8; ++i) acc[i] = acc[i] * mine + __shfl_xor_sync(0xffffffffu, acc[i], o) * theirs;
        run_sum = run_sum * mine + other_sum * theirs, run_max = top;
    }
    if (lane < kLanesPerKey)
        for (int i = 0; i < 8; ++i) warp_out[warp][g * 8 + i] = acc[i];
    if (lane == 0) warp_max[warp] = run_max, warp_sum[warp] = run_sum;
    __syncthreads();
    float top = -INFINITY;
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, warp_max[w]);
    float total = 0.f, merged = 0.f;
    const int d = threadIdx.x;
    for (int w = 0; w < kWarps; ++w) {
        const float c = weight(warp_max[w], top);
        total += warp_sum[w] * c;
        if (d < D) merged += warp_out[w][d] * c;
    }
    return {top, total, merged};
}

template <int D, int kKeys>
__global__ void __launch_bounds__(kAttentionThreads) pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale,
                                                                          AttentionScratch scratch, int min_split, __half* out) {
    constexpr int kGroups = kAttentionThreads / (D / 8);
    CtaTrace trace(kCtaAttention, heads, gridDim.y);
    __shared__ bool last;
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, splits = gridDim.z;  // splits: for the longest context
    // The step's metadata and the keys cached by earlier steps do not depend on the previous
    // kernel (which writes q and this step's keys): they are read before waiting for it.
    const int len = m.positions[t] + 1;
    // This split's keys, in whole rounds of kGroups keys and at least min_split: a short
    // context stays in one CTA (no combine), splits past the context's end leave.
    const int per_split = max(min_split, ((len + splits - 1) / splits + kGroups - 1) / kGroups * kGroups);
    const int active = (len + per_split - 1) / per_split;
    if (split >= active) return;
    const int begin = split * per_split, end = min(len, begin + per_split);
    const RangeResult range = attendRange<D, kKeys>(heads, q, m, kv, scale, h, t, begin, end, freshFrom(m, t), trace);
    float top = range.top, total = range.total;
    const float merged = range.merged;
    const int d = threadIdx.x;
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

void setAttentionTraceSink(const TraceSink& sink) { cudaMemcpyToSymbol(g_trace_sink, &sink, sizeof sink); }

void launchPagedAttention(int T, int heads, const __half* q, const StepMeta& m, const KvLayer& kv, float scale, const AttentionScratch& scratch,
                          __half* out, cudaStream_t s) {
    // Enough CTAs for two per SM; the split count depends on T only, so a captured graph
    // stays valid as contexts grow (splits past a short context's end exit at once).
    // (llm.cuda.attention_splits caps it.)
    const int cap = std::clamp(stepKnobs().attention_splits, 1, kMaxAttentionSplits);
    int splits = 1;
    if (scratch.partials && T * heads <= scratch.capacity) splits = std::clamp((2 * scratch.sms + T * heads - 1) / (T * heads), 1, cap);
    const dim3 grid(heads, T, splits);
    // Keys in flight per group: 8 (one round for a 256-key split at D = 64, all of it cached
    // keys loaded before the wait) when few (token, head) pairs leave the GPU latency-bound,
    // else 4. H200, Llama-1.1B (32 heads) at batch 1, 3 interleaved rounds: 0.800-0.812
    // ms/token with 8, 0.819-0.831 with 4 (attention's time after its wait 4.5 vs 5.3 us).
    // llm.cuda.attention_keys=4 or 8 forces one.
    const int forced = stepKnobs().attention_keys;
    const bool eight = forced ? forced == 8 : T * heads <= 32;
    const int min_split = std::max(32, stepKnobs().attention_min_split);
    auto run = [&](auto kernel) { launchDependent(kernel, grid, dim3(kAttentionThreads), 0, s, heads, q, m, kv, scale, scratch, min_split, out); };
    if (kv.head_dim == 64) eight ? run(pagedAttentionKernel<64, 8>) : run(pagedAttentionKernel<64, 4>);
    else eight ? run(pagedAttentionKernel<128, 8>) : run(pagedAttentionKernel<128, 4>);
}

}  // namespace kiln::llm::cuda
