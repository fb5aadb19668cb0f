// Tensor-core attention in the FlashAttention-2 manner: out = softmax(Q Kt * scale + mask) V
// for f16 and bf16 operands with f32 accumulation. A block of four warps takes 64 query rows
// of one (batch, head); each warp keeps its 16 rows of Q as MMA fragments in registers and
// walks the keys in tiles of 64 staged in shared memory. Scores stay in registers: the C
// fragments of Q Kt, scaled, masked and exponentiated against a running row maximum, are
// exactly the A fragments of P V (rounded to the operand type), so nothing but Q, K, V and
// the output touches device memory. Head sizes up to 128 (padded to 16 with zeros in shared
// memory); any query and key count (tails masked); the mask is read through a broadcast view.
#include "backends/cuda/kernels/device_math.cuh"
#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kBlockRows = 16 * kWarps;  // query rows per block: 16 per warp (one MMA row tile)
constexpr int kTileKeys = 64;
// Row padding in elements: rows 16 B past a multiple of 128 B put ldmatrix's 8 row
// addresses on distinct banks.
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

// Rows [0, rows) x columns [0, cols) of a row-major source with row stride `stride` into a
// [kRows][HP + kPad] shared tile, zero outside; 16-byte loads where the source allows them.
template <typename Elem, int kRows, int HP>
__device__ __forceinline__ void loadRows(Elem* dst, const Elem* src, int64_t stride, int rows, int cols, bool vec) {
    constexpr int kChunks = HP / 8;
    for (int i = threadIdx.x; i < kRows * kChunks; i += blockDim.x) {
        const int r = i / kChunks, c = (i % kChunks) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows && c < cols) {
            const Elem* s = src + r * stride + c;
            if (vec && c + 8 <= cols) {
                v = *reinterpret_cast<const uint4*>(s);
            } else {
                Elem e[8];
#pragma unroll
                for (int k = 0; k < 8; ++k) e[k] = c + k < cols ? s[k] : fromFloat<Elem>(0.f);
                v = *reinterpret_cast<const uint4*>(e);
            }
        }
        *reinterpret_cast<uint4*>(dst + r * (HP + kPad) + c) = v;
    }
}

// Keys [0, keys) of any-strided K (element (t, d) at t * key_stride + d * dim_stride) into
// a [kTileKeys][HP + kPad] tile; consecutive threads take consecutive keys, which reads a
// key-contiguous Kt coalesced.
template <typename Elem, int HP>
__device__ __forceinline__ void loadKeysStrided(Elem* dst, const Elem* src, int64_t key_stride, int64_t dim_stride, int keys, int dims) {
    for (int i = threadIdx.x; i < kTileKeys * HP; i += blockDim.x) {
        const int j = i % kTileKeys, d = i / kTileKeys;
        dst[j * (HP + kPad) + d] = j < keys && d < dims ? src[j * key_stride + d * dim_stride] : fromFloat<Elem>(0.f);
    }
}

// The mask's element type is a run-time switch (uniform across the grid) rather than a
// template parameter: a third of the instantiations, and the read is off the MMA path.
enum MaskKind : int { kNoMask = 0, kMaskF32, kMaskF16, kMaskBF16 };
__device__ __forceinline__ float maskValue(const void* m, int kind, int64_t i) {
    switch (kind) {
        case kMaskF32: return static_cast<const float*>(m)[i];
        case kMaskF16: return __half2float(static_cast<const __half*>(m)[i]);
        default: return __bfloat162float(static_cast<const __nv_bfloat16*>(m)[i]);
    }
}

__device__ __forceinline__ bool aligned16(const void* p, int64_t stride) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0 && stride % 8 == 0;
}

template <typename Elem, int HP>
__global__ void __launch_bounds__(kWarps * 32) flashAttentionKernel(AttentionOperands<Elem> a, const void* mask, int mask_kind, View6 vm,
                                                                      Shape6 score_shape) {
    extern __shared__ __align__(16) unsigned char flash_smem[];
    Elem* qs = reinterpret_cast<Elem*>(flash_smem);  // [kBlockRows][HP + kPad]
    Elem* ks = qs + kBlockRows * (HP + kPad);          // [kTileKeys][HP + kPad]
    Elem* vs = ks + kTileKeys * (HP + kPad);           // [kTileKeys][HP + kPad]
    float* ms = reinterpret_cast<float*>(vs + kTileKeys * (HP + kPad));  // [kBlockRows][kTileKeys + 1], with a mask
    const int D = static_cast<int>(a.D), E = static_cast<int>(a.E);
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, t4 = lane % 4;
    const int64_t bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
    const int64_t s0 = static_cast<int64_t>(blockIdx.y) * kBlockRows;
    const Elem* qb = a.q + b * a.q_batch + h * a.q_head + s0 * a.q_row;
    const Elem* kb = a.k + b * a.k_batch + h * a.k_head;
    const Elem* vb = a.v + b * a.v_batch + h * a.v_head;
    const bool k_rows = a.k_dim == 1;
    const bool q_vec = aligned16(qb, a.q_row), k_vec = k_rows && aligned16(kb, a.k_key), v_vec = aligned16(vb, a.v_row);

    loadRows<Elem, kBlockRows, HP>(qs, qb, a.q_row, static_cast<int>(min(static_cast<int64_t>(kBlockRows), a.S - s0)), D, q_vec);
    __syncthreads();
    uint32_t qf[HP / 16][4];
#pragma unroll
    for (int kk = 0; kk < HP / 16; ++kk)
        ldmatrixX4(qf[kk], qs + (warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * (HP + kPad) + kk * 16 + 8 * (lane / 16));

    // This thread's two rows: g and g + 8 of the warp's 16.
    const int64_t row0 = s0 + warp * 16 + g, row1 = row0 + 8;
    const float scale2 = a.scale * kLog2e;  // exp2 of log2-scaled scores
    float run_max[2] = {-INFINITY, -INFINITY}, run_sum[2] = {0.f, 0.f};
    float o[HP / 8][4];
#pragma unroll
    for (int n = 0; n < HP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int64_t t0 = 0; t0 < a.T; t0 += kTileKeys) {
        const int n_keys = static_cast<int>(min(static_cast<int64_t>(kTileKeys), a.T - t0));
        __syncthreads();  // the previous tile is no longer read
        if (k_rows) loadRows<Elem, kTileKeys, HP>(ks, kb + t0 * a.k_key, a.k_key, n_keys, D, k_vec);
        else loadKeysStrided<Elem, HP>(ks, kb + t0 * a.k_key, a.k_key, a.k_dim, n_keys, D);
        loadRows<Elem, kTileKeys, HP>(vs, vb + t0 * a.v_row, a.v_row, n_keys, E, v_vec);
        // The mask tile goes through shared memory: read coalesced along keys, and its
        // broadcast arithmetic stays out of the unrolled score loop.
        if (mask_kind != kNoMask) {
            for (int i = threadIdx.x; i < kBlockRows * kTileKeys; i += blockDim.x) {
                const int r = i / kTileKeys, j = i % kTileKeys;
                const int64_t row = s0 + r;
                ms[r * (kTileKeys + 1) + j] = row < a.S && j < n_keys ? maskValue(mask, mask_kind, viewOffset(vm, score_shape, (bh * a.S + row) * a.T + t0 + j)) : 0.f;
            }
        }
        __syncthreads();

        float s[kTileKeys / 8][4];
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HP / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < kTileKeys / 16; ++np) {
                uint32_t kf[4];
                ldmatrixX4(kf, ks + (np * 16 + (lane % 8) + 8 * (lane / 16)) * (HP + kPad) + kk * 16 + 8 * ((lane / 8) % 2));
                mma16816<Elem>(s[2 * np], qf[kk], kf[0], kf[1]);
                mma16816<Elem>(s[2 * np + 1], qf[kk], kf[2], kf[3]);
            }
        }

        // Scale, mask and the online softmax; a row's four lanes (one quad) share its maximum.
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int key = n * 8 + 2 * t4 + (c & 1);
                float x = s[n][c] * scale2;
                if (key >= n_keys) x = -INFINITY;
                else if (mask_kind != kNoMask) x += ms[(warp * 16 + g + (c < 2 ? 0 : 8)) * (kTileKeys + 1) + key] * kLog2e;
                s[n][c] = x;
                tile_max[c / 2] = fmaxf(tile_max[c / 2], x);
            }
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
            tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
            const float new_max = fmaxf(run_max[r], tile_max[r]);
            // A row masked to -inf so far keeps p = 0 and its (zero) sums unscaled: no inf - inf.
            corr[r] = new_max == -INFINITY ? 1.f : exp2f(run_max[r] - new_max);
            run_max[r] = new_max;
            run_sum[r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < kTileKeys / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float m = run_max[c / 2];
                const float p = m == -INFINITY ? 0.f : exp2f(s[n][c] - m);
                s[n][c] = p;
                run_sum[c / 2] += p;
            }
        }
#pragma unroll
        for (int n = 0; n < HP / 8; ++n) o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];

        // P V: the score fragments of keys 16j..16j+15 are the A fragment of k-step j.
#pragma unroll
        for (int j = 0; j < kTileKeys / 16; ++j) {
            const uint32_t pa[4] = {packPair<Elem>(s[2 * j][0], s[2 * j][1]), packPair<Elem>(s[2 * j][2], s[2 * j][3]),
                                    packPair<Elem>(s[2 * j + 1][0], s[2 * j + 1][1]), packPair<Elem>(s[2 * j + 1][2], s[2 * j + 1][3])};
#pragma unroll
            for (int ep = 0; ep < HP / 16; ++ep) {
                uint32_t vf[4];
                ldmatrixX4Trans(vf, vs + (j * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * (HP + kPad) + ep * 16 + 8 * (lane / 16));
                mma16816<Elem>(o[2 * ep], pa, vf[0], vf[1]);
                mma16816<Elem>(o[2 * ep + 1], pa, vf[2], vf[3]);
            }
        }
    }

    // Each lane summed its own columns: the row's sum is the quad's.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        run_sum[r] += __shfl_xor_sync(0xffffffffu, run_sum[r], 1);
        run_sum[r] += __shfl_xor_sync(0xffffffffu, run_sum[r], 2);
    }
    const float inv[2] = {1.f / run_sum[0], 1.f / run_sum[1]};  // a fully masked row gives NaN, as softmax does
    Elem* ob = a.out + b * a.out_batch + h * a.out_head;
#pragma unroll
    for (int n = 0; n < HP / 8; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int e = n * 8 + 2 * t4 + (c & 1);
            const int64_t row = c < 2 ? row0 : row1;
            if (e < E && row < a.S) ob[row * a.out_row + e] = fromFloat<Elem>(o[n][c] * inv[c / 2]);
        }
    }
}

template <typename Elem, int HP>
void launchFlash(const AttentionOperands<Elem>& a, const void* mask, int mask_kind, const View6& vm, const Shape6& score_shape, cudaStream_t s) {
    auto kernel = flashAttentionKernel<Elem, HP>;
    const int smem = (kBlockRows + 2 * kTileKeys) * (HP + kPad) * static_cast<int>(sizeof(Elem)) +
                     (mask_kind != kNoMask ? kBlockRows * (kTileKeys + 1) * static_cast<int>(sizeof(float)) : 0);
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    const dim3 grid(static_cast<unsigned>(a.batch * a.heads), static_cast<unsigned>((a.S + kBlockRows - 1) / kBlockRows));
    kernel<<<grid, kWarps * 32, smem, s>>>(a, mask, mask_kind, classifyView(vm, score_shape), score_shape);
}

}  // namespace

bool flashAttentionSupports(DType t, const AttentionGeometry& g) {
    return (t == DType::F16 || t == DType::BF16) && g.D <= kFlashAttentionMaxHead && g.E <= kFlashAttentionMaxHead &&
           (g.S + kBlockRows - 1) / kBlockRows < 65536;
}

void launchFlashAttention(DType t, const AttentionGeometry& g, const void* q, const void* k, const void* v, DType mt, const void* mask,
                          const View6& vm, const Shape6& score_shape, void* out, float scale, cudaStream_t s) {
    clearStaleError();
    if (g.batch * g.heads == 0 || g.S == 0 || g.E == 0) return;
    check(g.T > 0 && flashAttentionSupports(t, g), "flash attention: element type or head size outside the kernel's limits");
    const int64_t head = std::max(g.D, g.E);
    int mask_kind = kNoMask;
    if (mask) {
        if (mt == DType::F32) mask_kind = kMaskF32;
        else if (mt == DType::F16) mask_kind = kMaskF16;
        else if (mt == DType::BF16) mask_kind = kMaskBF16;
        else throw Error("flash attention: mask element type " + std::string(dtypeName(mt)) + " is not supported");
    }
    auto run = [&](auto* tag) {
        using T_ = std::remove_pointer_t<decltype(tag)>;
        AttentionOperands<T_> a;
        static_cast<AttentionGeometry&>(a) = g;
        a.q = static_cast<const T_*>(q), a.k = static_cast<const T_*>(k), a.v = static_cast<const T_*>(v), a.out = static_cast<T_*>(out);
        a.scale = scale;
        // Head sizes padded to the next instantiated width (zeros cost MMAs, not accuracy).
        if (head <= 32) launchFlash<T_, 32>(a, mask, mask_kind, vm, score_shape, s);
        else if (head <= 64) launchFlash<T_, 64>(a, mask, mask_kind, vm, score_shape, s);
        else if (head <= 80) launchFlash<T_, 80>(a, mask, mask_kind, vm, score_shape, s);
        else if (head <= 96) launchFlash<T_, 96>(a, mask, mask_kind, vm, score_shape, s);
        else launchFlash<T_, 128>(a, mask, mask_kind, vm, score_shape, s);
    };
    if (t == DType::F16) run(static_cast<__half*>(nullptr));
    else run(static_cast<__nv_bfloat16*>(nullptr));
    checkLaunch("flash attention");
}

}  // namespace kiln::cuda
