// Reductions over one run of consecutive axes, seen as [outer, R, inner]: ReduceSum,
// ReduceMean, ReduceMax, ReduceMin (f32 accumulation). inner == 1 reduces contiguous rows,
// one block each; otherwise one thread per (outer, inner) walks R, reads coalesced over inner.
#include <cfloat>
#include <type_traits>

#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

__device__ __forceinline__ float combine(ReduceOp op, float a, float b) {
    switch (op) {
        case ReduceOp::Max: return fmaxf(a, b);
        case ReduceOp::Min: return fminf(a, b);
        default: return a + b;
    }
}

__device__ __forceinline__ float identityOf(ReduceOp op) { return op == ReduceOp::Max ? -INFINITY : (op == ReduceOp::Min ? INFINITY : 0.f); }

__device__ __forceinline__ float finish(ReduceOp op, float acc, int64_t r) { return op == ReduceOp::Mean ? acc / static_cast<float>(r) : acc; }

// NaN propagates through max and min, as the CPU kernels (and numpy) do.
__device__ __forceinline__ float combineNan(ReduceOp op, float a, float b) { return (isnan(a) || isnan(b)) && (op == ReduceOp::Max || op == ReduceOp::Min) ? NAN : combine(op, a, b); }

template <typename T>
__global__ void reduceRowsKernel(ReduceOp op, const T* x, T* y, int64_t r) {
    const T* row = x + blockIdx.x * r;
    float acc = identityOf(op);
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x) acc = combineNan(op, acc, toFloat(row[j]));
    for (int o = 16; o > 0; o >>= 1) acc = combineNan(op, acc, __shfl_xor_sync(0xffffffffu, acc, o));
    __shared__ float warp_acc[32];
    if ((threadIdx.x & 31) == 0) warp_acc[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = identityOf(op);
        for (int w = 0; w < int(blockDim.x / 32); ++w) total = combineNan(op, total, warp_acc[w]);
        y[blockIdx.x] = fromFloat<T>(finish(op, total, r));
    }
}

template <typename T>
__global__ void reduceStridedKernel(ReduceOp op, const T* x, T* y, int64_t outer, int64_t r, int64_t inner) {
    const int64_t n = outer * inner;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = i / inner, k = i % inner;
        const T* p = x + o * r * inner + k;
        float acc = identityOf(op);
        for (int64_t j = 0; j < r; ++j) acc = combineNan(op, acc, toFloat(p[j * inner]));
        y[i] = fromFloat<T>(finish(op, acc, r));
    }
}

// ArgMax/ArgMin: one thread per (outer, inner) line; the first extreme, or the last with
// `last` (select_last_index), compared in f32 as the reference compares in double (f32 and
// f16 values convert exactly); integers (token ids) as themselves.
template <typename T>
__device__ __forceinline__ auto argKey(T v) {
    if constexpr (std::is_integral_v<T>) return v;
    else return toFloat(v);
}

template <typename T>
__global__ void argExtremeKernel(bool is_max, bool last, const T* x, int64_t* y, int64_t outer, int64_t r, int64_t inner) {
    const int64_t n = outer * inner;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = i / inner, k = i % inner;
        const T* p = x + o * r * inner + k;
        auto best = argKey(p[0]);
        int64_t at = 0;
        for (int64_t j = 1; j < r; ++j) {
            const auto v = argKey(p[j * inner]);
            if (is_max ? (v > best || (last && v == best)) : (v < best || (last && v == best))) best = v, at = j;
        }
        y[i] = at;
    }
}

}  // namespace

void launchArgExtreme(DType t, bool is_max, bool last, const void* x, int64_t* y, int64_t outer, int64_t r, int64_t inner, cudaStream_t s) {
    if (outer * inner == 0) return;
    clearStaleError();
    auto launch = [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        argExtremeKernel<T><<<gridFor(outer * inner, 256), 256, 0, s>>>(is_max, last, static_cast<const T*>(x), y, outer, r, inner);
    };
    if (t == DType::I32) launch(static_cast<int32_t*>(nullptr));
    else if (t == DType::I64) launch(static_cast<int64_t*>(nullptr));
    else dispatchDeviceFloat(t, "ArgMax/ArgMin", launch);
    checkLaunch("arg extreme");
}

void launchReduce(DType t, ReduceOp op, const void* x, void* y, int64_t outer, int64_t r, int64_t inner, cudaStream_t s) {
    if (outer * inner == 0) return;
    clearStaleError();
    dispatchDeviceFloat(t, "Reduce", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        const T* in = static_cast<const T*>(x);
        T* out = static_cast<T*>(y);
        if (inner == 1 && outer < 2147483647) {
            reduceRowsKernel<T><<<static_cast<unsigned>(outer), r >= 1024 ? 256 : 64, 0, s>>>(op, in, out, r);
        } else {
            reduceStridedKernel<T><<<gridFor(outer * inner, 256), 256, 0, s>>>(op, in, out, outer, r, inner);
        }
    });
    checkLaunch("reduce");
}

}  // namespace kiln::cuda
