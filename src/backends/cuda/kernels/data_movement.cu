// Data movement and pooling kernels: one strided copy for Transpose/Concat/Split/Slice/
// Expand, Gather and 2-D max/average pooling (GlobalAveragePool is a mean reduction, reduce.cu).
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

template <typename E>
__global__ void stridedCopyKernel(const E* src, View6 sv, E* dst, View6 dv, Shape6 shape, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dst[viewOffset(dv, shape, i)] = src[viewOffset(sv, shape, i)];
}

template <typename E, typename I>
__global__ void gatherKernel(const E* data, const I* idx, E* out, int64_t outer, int64_t axis_len, int64_t n_idx, int64_t inner, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t in = i % inner, rest = i / inner, j = rest % n_idx, o = rest / n_idx;
        int64_t k = static_cast<int64_t>(idx[j]);
        if (k < 0) k += axis_len;
        k = k < 0 ? 0 : (k >= axis_len ? axis_len - 1 : k);
        out[i] = data[(o * axis_len + k) * inner + in];
    }
}

template <typename T>
__global__ void pool2dKernel(Pool2d p, const T* x, T* y, int64_t total) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t n, c, oy, ox;
        if (p.channels_last) {
            c = i % p.c;
            ox = (i / p.c) % p.ow;
            oy = (i / p.c / p.ow) % p.oh;
            n = i / p.c / p.ow / p.oh;
        } else {
            ox = i % p.ow;
            oy = (i / p.ow) % p.oh;
            c = (i / p.ow / p.oh) % p.c;
            n = i / p.ow / p.oh / p.c;
        }
        float acc = p.max ? -INFINITY : 0.f;
        int64_t count = 0;
        for (int64_t ky = 0; ky < p.kh; ++ky) {
            const int64_t iy = oy * p.sh - p.ph + ky * p.dh;
            for (int64_t kx = 0; kx < p.kw; ++kx) {
                const int64_t ix = ox * p.sw - p.pw + kx * p.dw;
                if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) {
                    if (p.count_include_pad) ++count;
                    continue;
                }
                const int64_t off = p.channels_last ? ((n * p.h + iy) * p.w + ix) * p.c + c : ((n * p.c + c) * p.h + iy) * p.w + ix;
                const float v = toFloat(x[off]);
                if (p.max) acc = (v > acc || isnan(v)) ? v : acc;
                else acc += v;
                ++count;
            }
        }
        y[i] = fromFloat<T>(p.max ? acc : (count ? acc / count : 0.f));
    }
}

}  // namespace

void launchStridedCopy(size_t elem, const void* src, const View6& sv_in, void* dst, const View6& dv_in, const Shape6& shape, cudaStream_t s) {
    clearStaleError();
    const int64_t n = shape.numel();
    if (n == 0) return;
    if (sv_in.dense && dv_in.dense) {
        const cudaError_t e = cudaMemcpyAsync(static_cast<char*>(dst) + dv_in.offset * elem, static_cast<const char*>(src) + sv_in.offset * elem, n * elem,
                                              cudaMemcpyDeviceToDevice, s);
        check(e == cudaSuccess, std::string("CUDA copy: ") + cudaGetErrorString(e));
        return;
    }
    const unsigned grid = gridFor(n, kThreads);
    const View6 sv = classifyView(sv_in, shape), dv = classifyView(dv_in, shape);
    switch (elem) {
        case 1: stridedCopyKernel<uint8_t><<<grid, kThreads, 0, s>>>(static_cast<const uint8_t*>(src), sv, static_cast<uint8_t*>(dst), dv, shape, n); break;
        case 2: stridedCopyKernel<uint16_t><<<grid, kThreads, 0, s>>>(static_cast<const uint16_t*>(src), sv, static_cast<uint16_t*>(dst), dv, shape, n); break;
        case 4: stridedCopyKernel<uint32_t><<<grid, kThreads, 0, s>>>(static_cast<const uint32_t*>(src), sv, static_cast<uint32_t*>(dst), dv, shape, n); break;
        case 8: stridedCopyKernel<uint64_t><<<grid, kThreads, 0, s>>>(static_cast<const uint64_t*>(src), sv, static_cast<uint64_t*>(dst), dv, shape, n); break;
        default: throw Error("CUDA copy: unsupported element size");
    }
    checkLaunch("strided copy");
}

void launchGather(size_t elem, const void* data, DType index_type, const void* indices, void* out, int64_t outer, int64_t axis_len,
                  int64_t n_indices, int64_t inner, cudaStream_t s) {
    clearStaleError();
    const int64_t n = outer * n_indices * inner;
    if (n == 0) return;
    check(axis_len > 0, "CUDA Gather: empty axis");
    const unsigned grid = gridFor(n, kThreads);
    auto run = [&](auto* etag, auto* itag) {
        using E = std::remove_pointer_t<decltype(etag)>;
        using I = std::remove_pointer_t<decltype(itag)>;
        gatherKernel<E, I><<<grid, kThreads, 0, s>>>(static_cast<const E*>(data), static_cast<const I*>(indices), static_cast<E*>(out), outer, axis_len,
                                                     n_indices, inner, n);
    };
    auto by_index = [&](auto* etag) {
        if (index_type == DType::I64) run(etag, static_cast<int64_t*>(nullptr));
        else if (index_type == DType::I32) run(etag, static_cast<int32_t*>(nullptr));
        else throw Error("CUDA Gather: indices must be int32 or int64");
    };
    switch (elem) {
        case 1: by_index(static_cast<uint8_t*>(nullptr)); break;
        case 2: by_index(static_cast<uint16_t*>(nullptr)); break;
        case 4: by_index(static_cast<uint32_t*>(nullptr)); break;
        case 8: by_index(static_cast<uint64_t*>(nullptr)); break;
        default: throw Error("CUDA Gather: unsupported element size");
    }
    checkLaunch("gather");
}

void launchPool2d(DType t, const Pool2d& p, const void* x, void* y, cudaStream_t s) {
    clearStaleError();
    const int64_t total = p.n * p.c * p.oh * p.ow;
    if (total == 0) return;
    dispatchDeviceFloat(t, "pool", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        pool2dKernel<T><<<gridFor(total, kThreads), kThreads, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y), total);
    });
    checkLaunch("pool2d");
}

}  // namespace kiln::cuda
