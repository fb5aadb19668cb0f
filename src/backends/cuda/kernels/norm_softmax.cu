// Row kernels: LayerNormalization, Softmax/LogSoftmax and attention's scaled masked
// softmax. One block per row, f32 accumulation, two passes over the row (the second
// read hits L1/L2 for the row sizes transformers use).
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {


template <bool Max>
__device__ float blockReduce(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = Max ? fmaxf(v, other) : v + other;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, warps = blockDim.x / 32;
    __syncthreads();  // scratch may still be read from a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float r = Max ? -INFINITY : 0.f;
    for (int w = 0; w < warps; ++w) r = Max ? fmaxf(r, scratch[w]) : r + scratch[w];
    return r;
}

template <typename T, typename P>
__global__ void layerNormKernel(const T* x, const P* scale, const P* bias, T* y, int64_t cols, float eps, int64_t row_channels) {
    __shared__ float scratch[32];
    const int64_t channel = row_channels ? static_cast<int64_t>(blockIdx.x) % row_channels : -1;  // one scale/bias per row
    const T* row = x + blockIdx.x * cols;
    T* out = y + blockIdx.x * cols;
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += toFloat(row[j]);
    const float mean = blockReduce<false>(sum, scratch) / static_cast<float>(cols);
    float sq = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float d = toFloat(row[j]) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(blockReduce<false>(sq, scratch) / static_cast<float>(cols) + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const int64_t k = channel >= 0 ? channel : j;
        float v = (toFloat(row[j]) - mean) * rstd * toFloat(scale[k]);
        if (bias) v += toFloat(bias[k]);
        out[j] = fromFloat<T>(v);
    }
}

template <typename T>
__global__ void softmaxKernel(const T* x, T* y, int64_t cols, bool log) {
    __shared__ float scratch[32];
    const T* row = x + blockIdx.x * cols;
    T* out = y + blockIdx.x * cols;
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, toFloat(row[j]));
    mx = blockReduce<true>(mx, scratch);
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(toFloat(row[j]) - mx);
    sum = blockReduce<false>(sum, scratch);
    const float log_sum = logf(sum);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = toFloat(row[j]) - mx;
        out[j] = fromFloat<T>(log ? v - log_sum : expf(v) / sum);
    }
}

template <typename T, typename M>
__global__ void scaledMaskedSoftmaxKernel(const float* scores, float scale, const M* mask, View6 vm, Shape6 shape, T* p) {
    __shared__ float scratch[32];
    const int64_t cols = shape.dims[shape.rank - 1];
    const int64_t base = blockIdx.x * cols;
    const float* row = scores + base;
    auto value = [&](int64_t j) {
        float v = row[j] * scale;
        if (mask) v += toFloat(mask[viewOffset(vm, shape, base + j)]);
        return v;
    };
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, value(j));
    mx = blockReduce<true>(mx, scratch);
    float sum = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(value(j) - mx);
    sum = blockReduce<false>(sum, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) p[base + j] = fromFloat<T>(expf(value(j) - mx) / sum);
}

unsigned threadsFor(int64_t cols) { return cols >= 1024 ? 512 : (cols >= 256 ? 256 : (cols >= 64 ? 64 : 32)); }

unsigned rowGrid(int64_t rows) {
    check(rows < (int64_t(1) << 31), "CUDA row kernel: too many rows");
    return static_cast<unsigned>(rows);
}

}  // namespace

void launchLayerNorm(DType t, DType pt, const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t cols, float eps,
                     cudaStream_t s, int64_t row_channels) {
    clearStaleError();
    if (rows == 0 || cols == 0) return;
    dispatchDeviceFloat(t, "LayerNormalization", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        dispatchDeviceFloat(pt, "LayerNormalization scale", [&](auto* ptag) {
            using P = std::remove_pointer_t<decltype(ptag)>;
            layerNormKernel<T, P><<<rowGrid(rows), threadsFor(cols), 0, s>>>(static_cast<const T*>(x), static_cast<const P*>(scale),
                                                                             static_cast<const P*>(bias), static_cast<T*>(y), cols, eps, row_channels);
        });
    });
    checkLaunch("layer norm");
}

void launchSoftmax(DType t, const void* x, void* y, int64_t rows, int64_t cols, bool log, cudaStream_t s) {
    clearStaleError();
    if (rows == 0 || cols == 0) return;
    dispatchDeviceFloat(t, "Softmax", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        softmaxKernel<T><<<rowGrid(rows), threadsFor(cols), 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), cols, log);
    });
    checkLaunch("softmax");
}

void launchScaledMaskedSoftmax(DType t, const float* scores, float scale, DType mt, const void* mask, const View6& vm, const Shape6& shape,
                               void* p, cudaStream_t s) {
    clearStaleError();
    const int64_t cols = shape.dims[shape.rank - 1];
    const int64_t rows = cols ? shape.numel() / cols : 0;
    if (rows == 0) return;
    dispatchDeviceFloat(t, "attention softmax", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        dispatchDeviceFloat(mask ? mt : t, "attention mask", [&](auto* mtag) {
            using M = std::remove_pointer_t<decltype(mtag)>;
            scaledMaskedSoftmaxKernel<T, M><<<rowGrid(rows), threadsFor(cols), 0, s>>>(scores, scale, static_cast<const M*>(mask), classifyView(vm, shape), shape,
                                                                                       static_cast<T*>(p));
        });
    });
    checkLaunch("scaled masked softmax");
}

namespace {

template <typename T, typename P>
__global__ void batchNormKernel(const T* x, const P* scale, const P* bias, const P* mean, const P* var, T* y, int64_t n, int64_t c, int64_t inner,
                                float eps) {
    const int64_t total = n * c * inner;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t ch = (i / inner) % c;
        const float k = toFloat(scale[ch]) * rsqrtf(toFloat(var[ch]) + eps);
        y[i] = fromFloat<T>((toFloat(x[i]) - toFloat(mean[ch])) * k + toFloat(bias[ch]));
    }
}

}  // namespace

void launchBatchNorm(DType t, DType pt, const void* x, const void* scale, const void* bias, const void* mean, const void* var, void* y,
                     int64_t n, int64_t c, int64_t inner, float eps, cudaStream_t s) {
    if (n * c * inner == 0) return;
    clearStaleError();
    dispatchDeviceFloat(t, "BatchNormalization", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        dispatchDeviceFloat(pt, "BatchNormalization parameters", [&](auto* ptag) {
            using P = std::remove_pointer_t<decltype(ptag)>;
            batchNormKernel<T, P><<<gridFor(n * c * inner, 256), 256, 0, s>>>(static_cast<const T*>(x), static_cast<const P*>(scale), static_cast<const P*>(bias),
                                                                           static_cast<const P*>(mean), static_cast<const P*>(var), static_cast<T*>(y), n, c, inner, eps);
        });
    });
    checkLaunch("batch norm");
}

}  // namespace kiln::cuda
