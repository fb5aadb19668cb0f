// Device-side helpers shared by the .cu files: type conversion through float, unary
// functions, broadcast offsets, launch checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "backends/cuda/kernels/kernels.h"
#include "ir/error.h"

namespace kiln::cuda {

template <typename T> __device__ __forceinline__ float toFloat(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float toFloat<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T fromFloat(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float applyUnary(const UnaryFn& f, float v) {
    switch (f.op) {
        case UnaryOp::Identity: return v;
        case UnaryOp::Relu: return v > 0.f ? v : 0.f;
        case UnaryOp::Sigmoid: return 1.f / (1.f + expf(-v));
        case UnaryOp::Silu: return v / (1.f + expf(-v));
        case UnaryOp::Tanh: return tanhf(v);
        case UnaryOp::LeakyRelu: return v >= 0.f ? v : f.a * v;
        case UnaryOp::Clip: return isnan(v) ? v : fminf(fmaxf(v, f.a), f.b);
        case UnaryOp::HardSigmoid: return fminf(fmaxf(f.a * v + f.b, 0.f), 1.f);
        case UnaryOp::HardSwish: return v * fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f);
        case UnaryOp::Gelu: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
        case UnaryOp::GeluTanh: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        case UnaryOp::Softplus: return v > 30.f ? v : log1pf(expf(v));
        case UnaryOp::Exp: return expf(v);
        case UnaryOp::Log: return logf(v);
        case UnaryOp::Sqrt: return sqrtf(v);
        case UnaryOp::Neg: return -v;
        case UnaryOp::Abs: return fabsf(v);
        case UnaryOp::Erf: return erff(v);
        case UnaryOp::Reciprocal: return 1.f / v;
        case UnaryOp::Floor: return floorf(v);
        case UnaryOp::Ceil: return ceilf(v);
        case UnaryOp::Sin: return sinf(v);
        case UnaryOp::Cos: return cosf(v);
        case UnaryOp::Elu: return v >= 0.f ? v : f.a * (expf(v) - 1.f);
        case UnaryOp::Selu: return v > 0.f ? f.b * v : f.b * (f.a * expf(v) - f.a);
        case UnaryOp::Softsign: return v / (1.f + fabsf(v));
        case UnaryOp::Sign: return v > 0.f ? 1.f : (v < 0.f ? -1.f : 0.f);
        case UnaryOp::Round: return rintf(v);
    }
    return v;
}

// Offset of flat index i of `shape` in an operand read through a classified view.
__device__ __forceinline__ int64_t viewOffset(const View6& v, const Shape6& shape, int64_t i) {
    switch (v.kind) {
        case kViewDense: return v.offset + i;
        case kViewScalar: return v.offset;
        case kViewChannel:
            if (v.small) return v.offset + static_cast<int64_t>((static_cast<uint32_t>(i) / static_cast<uint32_t>(v.div)) % static_cast<uint32_t>(v.mod)) * v.stride;
            return v.offset + ((i / v.div) % v.mod) * v.stride;
        case kViewModulo:
            if (v.small) return v.offset + static_cast<int64_t>(static_cast<uint32_t>(i) % static_cast<uint32_t>(v.mod));
            return v.offset + i % v.mod;
        default: break;
    }
    // Unrolled with constant indices: a run-time index into the kernel-parameter structs
    // would make every thread copy them to local memory (seen: 40x slower kernels).
    int64_t off = v.offset;
    if (v.small) {
        uint32_t j = static_cast<uint32_t>(i);
#pragma unroll
        for (int d = kMaxRank - 1; d >= 0; --d) {
            if (d < shape.rank) {
                const uint32_t n = static_cast<uint32_t>(shape.dims[d]);
                off += static_cast<int64_t>(j % n) * v.strides[d];
                j /= n;
            }
        }
        return off;
    }
#pragma unroll
    for (int d = kMaxRank - 1; d >= 0; --d) {
        if (d < shape.rank) {
            off += (i % shape.dims[d]) * v.strides[d];
            i /= shape.dims[d];
        }
    }
    return off;
}

inline unsigned gridFor(int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 1048576 ? 1048576 : blocks));
}

// Drops an error an earlier, unrelated runtime call left behind (libraries leave some), so
// that checkLaunch reports only this launch's own failure.
inline void clearStaleError() { (void)cudaGetLastError(); }

// Raises Error for a failed launch (bad configuration, missing kernel image).
inline void checkLaunch(const char* kernel) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) throw Error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

// Calls f(TypeTag<T>) with T the device type of a float DType.
template <typename F>
void dispatchDeviceFloat(DType t, const char* what, F&& f) {
    switch (t) {
        case DType::F32: f(static_cast<float*>(nullptr)); return;
        case DType::F16: f(static_cast<__half*>(nullptr)); return;
        case DType::BF16: f(static_cast<__nv_bfloat16*>(nullptr)); return;
        default: throw Error(std::string(what) + ": element type " + std::string(dtypeName(t)) + " is not supported on CUDA");
    }
}

}  // namespace kiln::cuda
