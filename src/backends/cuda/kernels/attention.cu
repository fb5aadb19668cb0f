// Fused scaled-dot-product attention: softmax(Q Kt * scale + mask) V in one kernel, with
// the scores kept in shared memory (never written to device memory). One warp computes
// one query row: lanes split the keys for Q.Kt (reads of Kt rows coalesce across lanes),
// then split the output features for P.V. The warps of a block take consecutive rows of
// one batch entry, so Kt and V tiles are shared through L1.
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

constexpr int kRowsPerBlock = 4;

template <typename T, typename M>
__global__ void fusedAttentionKernel(const T* q, const T* kt, const T* v, const M* mask, View6 vm, Shape6 score_shape, T* out, int64_t S,
                                     int64_t T_, int64_t D, int64_t E, float scale) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int64_t b = blockIdx.y;
    const int64_t s = blockIdx.x * kRowsPerBlock + warp;
    float* qrow = smem + warp * (D + T_);
    float* scores = qrow + D;
    if (s >= S) return;
    const T* qp = q + (b * S + s) * D;
    for (int64_t d = lane; d < D; d += 32) qrow[d] = toFloat(qp[d]) * scale;
    __syncwarp();
    const T* kb = kt + b * D * T_;
    const int64_t mask_row = (b * S + s) * T_;
    float mx = -INFINITY;
    for (int64_t t = lane; t < T_; t += 32) {
        float acc = 0.f;
        for (int64_t d = 0; d < D; ++d) acc += qrow[d] * toFloat(kb[d * T_ + t]);
        if (mask) acc += toFloat(mask[viewOffset(vm, score_shape, mask_row + t)]);
        scores[t] = acc;
        mx = fmaxf(mx, acc);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    for (int64_t t = lane; t < T_; t += 32) {
        const float p = expf(scores[t] - mx);
        scores[t] = p;
        sum += p;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncwarp();
    const float inv = 1.f / sum;
    const T* vb = v + b * T_ * E;
    T* op = out + (b * S + s) * E;
    for (int64_t e = lane; e < E; e += 32) {
        float acc = 0.f;
        for (int64_t t = 0; t < T_; ++t) acc += scores[t] * toFloat(vb[t * E + e]);
        op[e] = fromFloat<T>(acc * inv);
    }
}

}  // namespace

void launchFusedAttention(DType t, const void* q, const void* kt, const void* v, DType mt, const void* mask, const View6& vm,
                          const Shape6& score_shape, void* out, int64_t batch, int64_t S, int64_t T, int64_t D, int64_t E, float scale,
                          cudaStream_t s) {
    clearStaleError();
    if (batch == 0 || S == 0 || E == 0) return;
    check(T > 0 && T <= kFusedAttentionMaxKeys && D <= kFusedAttentionMaxHead && E <= kFusedAttentionMaxHead,
          "fused attention: sequence or head size outside the kernel's limits");
    check(batch < 65536, "fused attention: batch x heads too large");
    const size_t smem = kRowsPerBlock * (D + T) * sizeof(float);
    const dim3 grid(static_cast<unsigned>((S + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(batch));
    dispatchDeviceFloat(t, "Attention", [&](auto* tag) {
        using T_ = std::remove_pointer_t<decltype(tag)>;
        dispatchDeviceFloat(mask ? mt : t, "Attention mask", [&](auto* mtag) {
            using M = std::remove_pointer_t<decltype(mtag)>;
            auto kernel = fusedAttentionKernel<T_, M>;
            if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
            kernel<<<grid, kRowsPerBlock * 32, smem, s>>>(static_cast<const T_*>(q), static_cast<const T_*>(kt), static_cast<const T_*>(v),
                                                          static_cast<const M*>(mask), classifyView(vm, score_shape), score_shape, static_cast<T_*>(out), S, T, D, E, scale);
        });
    });
    checkLaunch("fused attention");
}

}  // namespace kiln::cuda
