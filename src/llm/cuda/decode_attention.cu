// Paged attention of the decoder step. One CTA per (query head, token, key split): each
// key's dot product is shared by D/8 lanes holding 16 bytes of q each, so a whole pass of
// keys loads at once; a tile's scores sit in shared memory for its softmax and an online
// rescale carries the running max and sum across tiles. When (token, head) pairs are too
// few to fill the GPU (batch-1 decode), the keys split over several CTAs (flash-decoding):
// each writes its max, sum and unnormalized output, and the last to finish combines them.
#include <algorithm>

#include "llm/cuda/decoder_device.cuh"

namespace kiln::llm::cuda {

namespace {

constexpr int kAttentionThreads = 256;
constexpr int kAttentionTile = 256;  // keys whose scores are held in shared memory at once

template <int D>
__global__ void __launch_bounds__(kAttentionThreads) pagedAttentionKernel(int heads, const __half* q, StepMeta m, KvLayer kv, float scale,
                                                                          AttentionScratch scratch, __half* out) {
    waitForPredecessor();
    constexpr int kLanesPerKey = D / 8, kKeysPerPass = kAttentionThreads / kLanesPerKey;
    __shared__ float score[kAttentionTile];
    __shared__ float reduce[32];
    __shared__ float partial[kKeysPerPass][D + 1];
    __shared__ bool last;
    const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
    const int g = threadIdx.x % kLanesPerKey, key_lane = threadIdx.x / kLanesPerKey;
    const int kh = h / (heads / kv.kv_heads);
    const int len = m.positions[t] + 1;
    // This split's keys: whole passes, so that splits of short contexts stay one pass each.
    const int per_split = ((len + splits - 1) / splits + kKeysPerPass - 1) / kKeysPerPass * kKeysPerPass;
    const int begin = min(len, split * per_split), end = min(len, begin + per_split);
    const int32_t* table = m.block_tables + int64_t(m.token_chunk[t]) * m.max_blocks;
    float qf[8], acc[8] = {};
    const uint4 qv = *reinterpret_cast<const uint4*>(q + (int64_t(t) * heads + h) * D + g * 8);
    const __half2* qh = reinterpret_cast<const __half2*>(&qv);
    for (int i = 0; i < 4; ++i) qf[2 * i] = __low2float(qh[i]) * scale, qf[2 * i + 1] = __high2float(qh[i]) * scale;
    auto address = [&](int j) { return ((int64_t(table[j / kv.block_size]) * kv.kv_heads + kh) * kv.block_size + j % kv.block_size) * D + g * 8; };
    float run_max = -INFINITY, run_sum = 0.f;
    for (int tile = begin; tile < end; tile += kAttentionTile) {
        const int n = min(kAttentionTile, end - tile);
#pragma unroll 4
        for (int base = 0; base < n; base += kKeysPerPass) {  // uniform trip count: the shuffles need whole warps
            const int jj = base + key_lane;
            uint4 kvec = {};
            if (jj < n) kvec = *reinterpret_cast<const uint4*>(kv.k + address(tile + jj));
            const __half2* k2 = reinterpret_cast<const __half2*>(&kvec);
            float dot = 0.f;
            for (int i = 0; i < 4; ++i) dot += qf[2 * i] * __low2float(k2[i]) + qf[2 * i + 1] * __high2float(k2[i]);
            for (int o = kLanesPerKey / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (g == 0 && jj < n) score[jj] = dot;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int i = threadIdx.x; i < n; i += kAttentionThreads) mx = fmaxf(mx, score[i]);
        const float new_max = fmaxf(run_max, blockReduce<kAttentionThreads>(mx, reduce, true));
        float sum = 0.f;
        for (int i = threadIdx.x; i < n; i += kAttentionThreads) {
            const float p = __expf(score[i] - new_max);
            score[i] = p, sum += p;
        }
        sum = blockReduce<kAttentionThreads>(sum, reduce, false);  // its barriers also publish the p values
        const float corr = __expf(run_max - new_max);  // 0 on the first tile
        run_sum = run_sum * corr + sum, run_max = new_max;
        for (int i = 0; i < 8; ++i) acc[i] *= corr;
#pragma unroll 4
        for (int jj = key_lane; jj < n; jj += kKeysPerPass) {
            const float p = score[jj];
            const uint4 vvec = *reinterpret_cast<const uint4*>(kv.v + address(tile + jj));
            const __half2* v2 = reinterpret_cast<const __half2*>(&vvec);
            for (int i = 0; i < 4; ++i) acc[2 * i] += p * __low2float(v2[i]), acc[2 * i + 1] += p * __high2float(v2[i]);
        }
        __syncthreads();  // the next tile overwrites score
    }
    for (int i = 0; i < 8; ++i) partial[key_lane][g * 8 + i] = acc[i];
    __syncthreads();
    __half* dst = out + (int64_t(t) * heads + h) * D;
    if (splits == 1) {
        for (int d = threadIdx.x; d < D; d += kAttentionThreads) {
            float o = 0.f;
            for (int k = 0; k < kKeysPerPass; ++k) o += partial[k][d];
            dst[d] = __float2half(o / run_sum);
        }
        return;
    }
    // Split: publish this split's (max, sum, output), then the pair's last CTA combines.
    const int pair = t * heads + h;
    float* mine = scratch.partials + (int64_t(pair) * kMaxAttentionSplits + split) * (D + 2);
    for (int d = threadIdx.x; d < D; d += kAttentionThreads) {
        float o = 0.f;
        for (int k = 0; k < kKeysPerPass; ++k) o += partial[k][d];
        mine[d] = o;
    }
    if (threadIdx.x == 0) mine[D] = run_max, mine[D + 1] = run_sum;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(scratch.counters + pair, 1) == splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float* all = scratch.partials + int64_t(pair) * kMaxAttentionSplits * (D + 2);
    float top = -INFINITY;
    for (int s = 0; s < splits; ++s) top = fmaxf(top, __ldcg(all + s * (D + 2) + D));
    float total = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float ssum = __ldcg(all + s * (D + 2) + D + 1);
        if (ssum > 0.f) total += ssum * __expf(__ldcg(all + s * (D + 2) + D) - top);
    }
    for (int d = threadIdx.x; d < D; d += kAttentionThreads) {
        float o = 0.f;
        for (int s = 0; s < splits; ++s) {
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
    int splits = 1;
    if (scratch.partials && T * heads <= scratch.capacity) splits = std::clamp((2 * scratch.sms + T * heads - 1) / (T * heads), 1, kMaxAttentionSplits);
    const dim3 grid(heads, T, splits);
    if (kv.head_dim == 64) launchDependent(pagedAttentionKernel<64>, grid, dim3(kAttentionThreads), 0, s, heads, q, m, kv, scale, scratch, out);
    else launchDependent(pagedAttentionKernel<128>, grid, dim3(kAttentionThreads), 0, s, heads, q, m, kv, scale, scratch, out);
}

}  // namespace kiln::llm::cuda
