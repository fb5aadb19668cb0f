// Owned device and pinned host memory for the CUDA executor and the GPU decoder: freed
// with its owner, grown (never shrunk) by ensure().
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "backends/cuda/cuda_check.h"

namespace kiln::cuda {

// Memory from `Alloc`, released with `Free`.
template <cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
struct OwnedCudaMemory {
    OwnedCudaMemory() = default;
    explicit OwnedCudaMemory(size_t b) { ensure(b); }
    OwnedCudaMemory(const OwnedCudaMemory&) = delete;
    OwnedCudaMemory& operator=(const OwnedCudaMemory&) = delete;
    OwnedCudaMemory(OwnedCudaMemory&& o) noexcept : ptr(std::exchange(o.ptr, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
    OwnedCudaMemory& operator=(OwnedCudaMemory&& o) noexcept {
        std::swap(ptr, o.ptr);
        std::swap(bytes, o.bytes);
        return *this;
    }
    ~OwnedCudaMemory() {
        if (ptr) Free(ptr);
    }
    // At least `b` bytes (the old contents are not kept when it grows).
    void ensure(size_t b) {
        if (b <= bytes) return;
        if (ptr) Free(ptr);
        ptr = nullptr;
        KILN_CUDA_CHECK(Alloc(&ptr, std::max<size_t>(b, 1)));
        bytes = b;
    }
    template <class T>
    T* as() const { return static_cast<T*>(ptr); }

    void* ptr = nullptr;
    size_t bytes = 0;
};

inline cudaError_t mallocDevice(void** p, size_t b) { return cudaMalloc(p, b); }
inline cudaError_t mallocPinned(void** p, size_t b) { return cudaMallocHost(p, b); }
using DeviceBuffer = OwnedCudaMemory<mallocDevice, cudaFree>;
using PinnedBuffer = OwnedCudaMemory<mallocPinned, cudaFreeHost>;

}  // namespace kiln::cuda
