// Fused scaled-dot-product attention: softmax(Q Kt * scale + mask) V in one kernel. A block
// takes kRowsPerBlock query rows of one (batch, head) and walks the keys in tiles of
// kKeyTile: the tile's keys and values are staged in shared memory (f32, keys padded so
// lane j reading key j's row hits its own bank), lane j scores key j of the tile, and an
// online softmax (running max and sum per row) carries the output across tiles, so the
// scores never touch device memory and any key count fits.
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kKeyTile = 32;  // one key per lane
constexpr int kMaxChunks = kFusedAttentionMaxHead / 32;

template <typename Elem, typename M>
__global__ void __launch_bounds__(kWarps * 32) fusedAttentionKernel(AttentionOperands<Elem> a, const M* mask, View6 vm, Shape6 score_shape) {
    extern __shared__ float smem[];
    const int D = static_cast<int>(a.D), E = static_cast<int>(a.E);
    float* ks = smem;                          // [kKeyTile][D + 1]
    float* vs = ks + kKeyTile * (D + 1);       // [kKeyTile][E]
    float* qs = vs + kKeyTile * E;             // [kRowsPerBlock][D], pre-scaled
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t bh = blockIdx.y, b = bh / a.heads, h = bh % a.heads;
    const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
    const Elem* qb = a.q + b * a.q_batch + h * a.q_head;
    const Elem* kb = a.k + b * a.k_batch + h * a.k_head;
    const Elem* vb = a.v + b * a.v_batch + h * a.v_head;
    for (int i = threadIdx.x; i < kRowsPerBlock * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        qs[i] = s0 + r < a.S ? toFloat(qb[(s0 + r) * a.q_row + d]) * a.scale : 0.f;
    }
    float run_max[kRowsPerWarp], run_sum[kRowsPerWarp], acc[kRowsPerWarp][kMaxChunks];
    for (int r = 0; r < kRowsPerWarp; ++r) {
        run_max[r] = -INFINITY, run_sum[r] = 0.f;
        for (int c = 0; c < kMaxChunks; ++c) acc[r][c] = 0.f;
    }
    for (int64_t t0 = 0; t0 < a.T; t0 += kKeyTile) {
        const int n = static_cast<int>(min(static_cast<int64_t>(kKeyTile), a.T - t0));
        __syncthreads();  // the previous tile is no longer read (and qs is written, first time)
        // Keys: consecutive threads take consecutive d (d-contiguous rows) or consecutive keys
        // (the canonical Kt, key-contiguous), whichever the layout reads coalesced.
        for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
            const int j = a.k_key == 1 ? i % kKeyTile : i / D, d = a.k_key == 1 ? i / kKeyTile : i % D;
            ks[j * (D + 1) + d] = j < n ? toFloat(kb[(t0 + j) * a.k_key + d * a.k_dim]) : 0.f;
        }
        for (int i = threadIdx.x; i < kKeyTile * E; i += blockDim.x) {
            const int j = i / E, e = i % E;
            vs[i] = j < n ? toFloat(vb[(t0 + j) * a.v_row + e]) : 0.f;
        }
        __syncthreads();
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int row = warp * kRowsPerWarp + r;
            const int64_t s = s0 + row;
            if (s >= a.S) break;  // whole warps leave together: rows are per warp
            const float* qr = qs + row * D;
            const float* kr = ks + lane * (D + 1);
            float score = 0.f;
            for (int d = 0; d < D; ++d) score += qr[d] * kr[d];
            if (lane >= n) score = -INFINITY;
            else if (mask) score += toFloat(mask[viewOffset(vm, score_shape, (bh * a.S + s) * a.T + t0 + lane)]);
            float tile_max = score;
            for (int o = 16; o > 0; o >>= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
            const float new_max = fmaxf(run_max[r], tile_max);
            // A row masked to -inf so far keeps p = 0 and no rescale (no inf - inf).
            const float p = new_max == -INFINITY ? 0.f : __expf(score - new_max);
            const float corr = run_max[r] == -INFINITY ? 0.f : __expf(run_max[r] - new_max);
            float psum = p;
            for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
            run_sum[r] = run_sum[r] * corr + psum;
            run_max[r] = new_max;
#pragma unroll
            for (int c = 0; c < kMaxChunks; ++c) acc[r][c] *= corr;
            for (int j = 0; j < n; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                const float* vr = vs + j * E;
#pragma unroll
                for (int c = 0; c < kMaxChunks; ++c)
                    if (c * 32 + lane < E) acc[r][c] += pj * vr[c * 32 + lane];
            }
        }
    }
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t s = s0 + warp * kRowsPerWarp + r;
        if (s >= a.S) break;
        Elem* o = a.out + b * a.out_batch + h * a.out_head + s * a.out_row;
        const float inv = 1.f / run_sum[r];  // a fully masked row gives NaN, as softmax does
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c)
            if (c * 32 + lane < E) o[c * 32 + lane] = fromFloat<Elem>(acc[r][c] * inv);
    }
}

}  // namespace

AttentionGeometry attentionGeometry(bool bshd, int64_t batch, int64_t heads, int64_t S, int64_t T, int64_t D, int64_t E) {
    AttentionGeometry g;
    g.batch = batch, g.heads = heads, g.S = S, g.T = T, g.D = D, g.E = E;
    if (bshd) {  // Q [B,S,H,D], K [B,T,H,D], V [B,T,H,E], out [B,S,H,E]
        g.q_batch = S * heads * D, g.q_head = D, g.q_row = heads * D;
        g.k_batch = T * heads * D, g.k_head = D, g.k_key = heads * D, g.k_dim = 1;
        g.v_batch = T * heads * E, g.v_head = E, g.v_row = heads * E;
        g.out_batch = S * heads * E, g.out_head = E, g.out_row = heads * E;
    } else {  // Q [BH,S,D], Kt [BH,D,T], V [BH,T,E], out [BH,S,E] with heads folded into batch
        g.q_batch = heads * S * D, g.q_head = S * D, g.q_row = D;
        g.k_batch = heads * D * T, g.k_head = D * T, g.k_key = 1, g.k_dim = T;
        g.v_batch = heads * T * E, g.v_head = T * E, g.v_row = E;
        g.out_batch = heads * S * E, g.out_head = S * E, g.out_row = E;
    }
    return g;
}

void launchFusedAttention(DType t, const AttentionGeometry& g, const void* q, const void* k, const void* v, DType mt, const void* mask,
                          const View6& vm, const Shape6& score_shape, void* out, float scale, cudaStream_t s) {
    clearStaleError();
    if (g.batch * g.heads == 0 || g.S == 0 || g.E == 0) return;
    check(g.T > 0 && g.D <= kFusedAttentionMaxHead && g.E <= kFusedAttentionMaxHead, "fused attention: head size outside the kernel's limits");
    check(g.batch * g.heads < 65536, "fused attention: batch x heads too large");
    const size_t smem = static_cast<size_t>(kKeyTile * (g.D + 1) + kKeyTile * g.E + kRowsPerBlock * g.D) * sizeof(float);
    const dim3 grid(static_cast<unsigned>((g.S + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(g.batch * g.heads));
    dispatchDeviceFloat(t, "Attention", [&](auto* tag) {
        using T_ = std::remove_pointer_t<decltype(tag)>;
        dispatchDeviceFloat(mask ? mt : t, "Attention mask", [&](auto* mtag) {
            using M = std::remove_pointer_t<decltype(mtag)>;
            auto kernel = fusedAttentionKernel<T_, M>;
            if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
            AttentionOperands<T_> a;
            static_cast<AttentionGeometry&>(a) = g;
            a.q = static_cast<const T_*>(q), a.k = static_cast<const T_*>(k), a.v = static_cast<const T_*>(v), a.out = static_cast<T_*>(out);
            a.scale = scale;
            kernel<<<grid, kWarps * 32, smem, s>>>(a, static_cast<const M*>(mask), classifyView(vm, score_shape), score_shape);
        });
    });
    checkLaunch("fused attention");
}

}  // namespace kiln::cuda
