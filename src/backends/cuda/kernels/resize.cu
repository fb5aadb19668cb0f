// Resize of the last two axes of [planes, H, W] data (nearest, linear or cubic; ONNX's
// coordinate transformations and nearest modes), each output element computing its source
// coordinate as the CPU reference does, in double precision for the coordinate itself.
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

__device__ double sourceCoordinate(const ResizeAxis& a, int mode, double x) {
    const double out_len = static_cast<double>(a.in) * a.scale;
    switch (mode) {
        case kCoordHalfPixel: return (x + 0.5) / a.scale - 0.5;
        case kCoordHalfPixelSymmetric: return 0.5 * a.in * (1 - a.out / out_len) + (x + 0.5) / a.scale - 0.5;
        case kCoordTfHalfPixelForNn: return (x + 0.5) / a.scale;
        case kCoordPytorchHalfPixel: return a.out > 1 ? (x + 0.5) / a.scale - 0.5 : 0.0;
        case kCoordAlignCorners: return out_len == 1 ? 0.0 : x * static_cast<double>(a.in - 1) / (out_len - 1);
        default: return x / a.scale;  // asymmetric
    }
}

__device__ int64_t nearestSource(int nearest, double x) {
    if (nearest == kNearestFloor) return static_cast<int64_t>(floor(x));
    if (nearest == kNearestCeil) return static_cast<int64_t>(ceil(x));
    const double frac = x - floor(x);
    if (fabs(frac - 0.5) < 1e-6) return static_cast<int64_t>(nearest == kNearestRoundPreferCeil ? ceil(x) : floor(x));
    return static_cast<int64_t>(round(x));
}

__device__ float cubicWeight(float s, float a) {
    s = fabsf(s);
    if (s <= 1) return ((a + 2) * s - (a + 3)) * s * s + 1;
    if (s < 2) return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
    return 0.f;
}

// The taps of output coordinate o along one axis: up to 4 (index, weight) pairs.
__device__ int axisTaps(const Resize2d& p, const ResizeAxis& a, int64_t o, int64_t* idx, float* w) {
    const double x = sourceCoordinate(a, p.coord, static_cast<double>(o));
    if (p.mode == kResizeNearest) {
        idx[0] = min(max(nearestSource(p.nearest, x), int64_t(0)), a.in - 1);
        w[0] = 1.f;
        return 1;
    }
    const int64_t x0 = static_cast<int64_t>(floor(x));
    const float t = static_cast<float>(x - static_cast<double>(x0));
    int n;
    if (p.mode == kResizeLinear) {
        idx[0] = x0, w[0] = 1 - t, idx[1] = x0 + 1, w[1] = t;
        n = 2;
    } else {
        const float c[4] = {cubicWeight(t + 1, p.cubic_a), cubicWeight(t, p.cubic_a), cubicWeight(1 - t, p.cubic_a), cubicWeight(2 - t, p.cubic_a)};
        for (int k = 0; k < 4; ++k) idx[k] = x0 - 1 + k, w[k] = c[k];
        n = 4;
    }
    float total = 0;
    for (int k = 0; k < n; ++k) {
        if (idx[k] < 0 || idx[k] >= a.in) {
            if (p.exclude_outside) w[k] = 0;
            idx[k] = min(max(idx[k], int64_t(0)), a.in - 1);
        }
        total += w[k];
    }
    if (p.exclude_outside && total != 0)
        for (int k = 0; k < n; ++k) w[k] /= total;
    return n;
}

template <typename T>
__global__ void resizeKernel(Resize2d p, const T* x, T* y) {
    const int64_t per_plane = p.h.out * p.w.out, n = p.planes * per_plane;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t plane = i / per_plane, rem = i % per_plane, oy = rem / p.w.out, ox = rem % p.w.out;
        int64_t iy[4], ix[4];
        float wy[4], wx[4];
        const int ny = axisTaps(p, p.h, oy, iy, wy), nx = axisTaps(p, p.w, ox, ix, wx);
        const T* src = x + plane * p.h.in * p.w.in;
        float acc = 0.f;
        for (int a = 0; a < ny; ++a) {
            float row = 0.f;
            for (int b = 0; b < nx; ++b) row += wx[b] * toFloat(src[iy[a] * p.w.in + ix[b]]);
            acc += wy[a] * row;
        }
        y[i] = fromFloat<T>(acc);
    }
}

}  // namespace

void launchResize2d(DType t, const Resize2d& p, const void* x, void* y, cudaStream_t s) {
    const int64_t n = p.planes * p.h.out * p.w.out;
    if (n == 0) return;
    clearStaleError();
    dispatchDeviceFloat(t, "Resize", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        resizeKernel<T><<<gridFor(n, 256), 256, 0, s>>>(p, static_cast<const T*>(x), static_cast<T*>(y));
    });
    checkLaunch("resize");
}

}  // namespace kiln::cuda
