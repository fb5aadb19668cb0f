// Kernels that map each output element to a source element by its coordinates: Pad (every
// mode), CumSum along one axis, GatherND.
#include <type_traits>

#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

int blocksFor(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

template <typename E>
__global__ void padKernel(const E* src, Shape6 in, E* dst, Shape6 out, PadSpec spec, E value, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t rem = i, off = 0, stride = 1;
        bool outside = false;
        for (int d = out.rank - 1; d >= 0; --d) {
            int64_t c = rem % out.dims[d] - spec.begin[d];
            rem /= out.dims[d];
            const int64_t len = in.dims[d];
            if (c < 0 || c >= len) {
                if (spec.mode == PadMode::Constant) {
                    outside = true;
                } else if (spec.mode == PadMode::Edge) {
                    c = c < 0 ? 0 : len - 1;
                } else if (spec.mode == PadMode::Wrap) {
                    c = ((c % len) + len) % len;
                } else {  // reflect, without repeating the edge: period 2 (len - 1)
                    const int64_t period = 2 * (len - 1);
                    if (period == 0) {
                        c = 0;
                    } else {
                        c = ((c % period) + period) % period;
                        if (c >= len) c = period - c;
                    }
                }
            }
            off += c * stride;
            stride *= len;
        }
        dst[i] = outside ? value : src[off];
    }
}

template <typename E>
void pad(const void* src, const Shape6& in, void* dst, const Shape6& out, const PadSpec& spec, const void* value, cudaStream_t s) {
    const int64_t n = out.numel();
    if (n == 0) return;
    E v{};
    memcpy(&v, value, sizeof(E));
    padKernel<E><<<blocksFor(n), kThreads, 0, s>>>(static_cast<const E*>(src), in, static_cast<E*>(dst), out, spec, v, n);
    checkLaunch("pad");
}

// One thread per (outer, inner) line, adding along the axis in order (as the reference does).
template <typename T, typename Acc>
__global__ void cumSumKernel(const T* x, T* y, int64_t outer, int64_t len, int64_t inner, bool exclusive, bool reverse) {
    const int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; l < lines; l += int64_t(gridDim.x) * blockDim.x) {
        const int64_t o = l / inner, in = l % inner;
        Acc acc = 0;
        for (int64_t k = 0; k < len; ++k) {
            const int64_t j = reverse ? len - 1 - k : k;
            const int64_t at = (o * len + j) * inner + in;
            Acc v;
            if constexpr (std::is_same_v<Acc, float>) v = toFloat(x[at]);
            else v = static_cast<Acc>(x[at]);
            if (!exclusive) acc += v;
            if constexpr (std::is_same_v<Acc, float>) y[at] = fromFloat<T>(acc);
            else y[at] = static_cast<T>(acc);
            if (exclusive) acc += v;
        }
    }
}

template <typename E, typename I>
__global__ void gatherNdKernel(const E* data, GatherNdSpec g, const I* idx, E* out, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t e = i % g.slice, tuple = i / g.slice, batch = tuple / g.tuples_per_batch;
        int64_t off = batch * g.batch_stride + e;
        for (int j = 0; j < g.k; ++j) {
            int64_t v = static_cast<int64_t>(idx[tuple * g.k + j]);
            if (v < 0) v += g.dims[j];
            v = v < 0 ? 0 : (v >= g.dims[j] ? g.dims[j] - 1 : v);
            off += v * g.strides[j];
        }
        out[i] = data[off];
    }
}

template <typename E, typename I>
__global__ void gatherElementsKernel(const E* data, View6 ds, int axis, int64_t axis_len, const I* idx, E* out, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t rest = i, off = 0;
        for (int d = shape.rank - 1; d >= 0; --d) {
            int64_t c = rest % shape.dims[d];
            rest /= shape.dims[d];
            if (d == axis) {
                c = static_cast<int64_t>(idx[i]);
                if (c < 0) c += axis_len;
                c = c < 0 ? 0 : (c >= axis_len ? axis_len - 1 : c);
            }
            off += c * ds.strides[d];
        }
        out[i] = data[off];
    }
}

// Calls f with a value of the unsigned type `elem` bytes wide: the kernels here only move
// elements, so their width is all that matters.
template <typename F>
void withElementWidth(size_t elem, const char* op, F&& f) {
    switch (elem) {
        case 1: return f(uint8_t{});
        case 2: return f(uint16_t{});
        case 4: return f(uint32_t{});
        case 8: return f(uint64_t{});
        default: throw Error(std::string(op) + ": no kernel for " + std::to_string(elem) + "-byte elements");
    }
}

}  // namespace

void launchGatherElements(size_t elem, const void* data, const View6& data_strides, int axis, int64_t axis_len, DType index_type, const void* indices,
                          void* out, const Shape6& shape, cudaStream_t s) {
    int64_t n = 1;
    for (int d = 0; d < shape.rank; ++d) n *= shape.dims[d];
    if (n == 0) return;
    clearStaleError();
    auto run = [&](auto e_tag) {
        using E = decltype(e_tag);
        if (index_type == DType::I32)
            gatherElementsKernel<E, int32_t><<<blocksFor(n), kThreads, 0, s>>>(static_cast<const E*>(data), data_strides, axis, axis_len,
                                                                              static_cast<const int32_t*>(indices), static_cast<E*>(out), shape, n);
        else
            gatherElementsKernel<E, int64_t><<<blocksFor(n), kThreads, 0, s>>>(static_cast<const E*>(data), data_strides, axis, axis_len,
                                                                              static_cast<const int64_t*>(indices), static_cast<E*>(out), shape, n);
        checkLaunch("gather_elements");
    };
    withElementWidth(elem, "GatherElements", run);
}

void launchPad(size_t elem, const void* src, const Shape6& in, void* dst, const Shape6& out, const PadSpec& spec, const void* value, cudaStream_t s) {
    withElementWidth(elem, "Pad", [&](auto e_tag) { pad<decltype(e_tag)>(src, in, dst, out, spec, value, s); });
}

void launchCumSum(DType t, const void* x, void* y, int64_t outer, int64_t len, int64_t inner, bool exclusive, bool reverse, cudaStream_t s) {
    const int64_t lines = outer * inner;
    if (lines == 0 || len == 0) return;
    const int blocks = blocksFor(lines);
    switch (t) {
        case DType::F32: cumSumKernel<float, float><<<blocks, kThreads, 0, s>>>(static_cast<const float*>(x), static_cast<float*>(y), outer, len, inner, exclusive, reverse); break;
        case DType::F16: cumSumKernel<__half, float><<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(x), static_cast<__half*>(y), outer, len, inner, exclusive, reverse); break;
        case DType::BF16:
            cumSumKernel<__nv_bfloat16, float><<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), outer, len, inner, exclusive, reverse);
            break;
        case DType::I32: cumSumKernel<int32_t, int64_t><<<blocks, kThreads, 0, s>>>(static_cast<const int32_t*>(x), static_cast<int32_t*>(y), outer, len, inner, exclusive, reverse); break;
        case DType::I64: cumSumKernel<int64_t, int64_t><<<blocks, kThreads, 0, s>>>(static_cast<const int64_t*>(x), static_cast<int64_t*>(y), outer, len, inner, exclusive, reverse); break;
        default: throw Error(std::string("CumSum: no kernel for ") + std::string(dtypeName(t)));
    }
    checkLaunch("cumsum");
}

void launchGatherNd(size_t elem, const void* data, const GatherNdSpec& g, DType index_type, const void* indices, void* out, int64_t n, cudaStream_t s) {
    if (n == 0) return;
    auto run = [&](auto e_tag) {
        using E = decltype(e_tag);
        if (index_type == DType::I32)
            gatherNdKernel<E, int32_t><<<blocksFor(n), kThreads, 0, s>>>(static_cast<const E*>(data), g, static_cast<const int32_t*>(indices), static_cast<E*>(out), n);
        else
            gatherNdKernel<E, int64_t><<<blocksFor(n), kThreads, 0, s>>>(static_cast<const E*>(data), g, static_cast<const int64_t*>(indices), static_cast<E*>(out), n);
        checkLaunch("gather_nd");
    };
    withElementWidth(elem, "GatherND", run);
}

}  // namespace kiln::cuda
