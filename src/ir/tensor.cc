#include "ir/tensor.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kiln {

namespace {
constexpr size_t kAlignment = 64;  // cache line; lets SIMD kernels use aligned loads

}  // namespace

std::shared_ptr<std::byte[]> allocateBytes(size_t bytes, bool zero) {
    check(bytes <= SIZE_MAX - kAlignment, [&] { return "cannot allocate " + std::to_string(bytes) + " bytes"; });
    size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p) throw std::bad_alloc();
    if (zero) std::memset(p, 0, rounded);
    return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

namespace {

size_t physicalMemory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : SIZE_MAX / 2;
}

size_t initialMaxTensorBytes() {
    if (const char* env = std::getenv("KILN_MAX_TENSOR_BYTES")) {
        char* end = nullptr;
        const unsigned long long v = std::strtoull(env, &end, 10);
        if (end != env && *end == 0 && v > 0) return static_cast<size_t>(v);
    }
    return physicalMemory();
}

std::atomic<size_t> g_max_tensor_bytes{initialMaxTensorBytes()};

}  // namespace

size_t maxTensorBytes() { return g_max_tensor_bytes.load(std::memory_order_relaxed); }
void setMaxTensorBytes(size_t bytes) {
    check(bytes > 0, "the tensor size limit must be positive");
    g_max_tensor_bytes.store(bytes, std::memory_order_relaxed);
}

size_t tensorBytes(DType dtype, const Dims& dims, const std::string& what) {
    int64_t n = 0;
    try {
        n = numElements(dims);
    } catch (const Error& e) {
        throw Error(what + ": " + e.what());
    }
    const size_t element = dtypeSize(dtype);
    const size_t limit = maxTensorBytes();
    if (element > 0 && static_cast<uint64_t>(n) > limit / element)
        throw Error(what + ": " + std::string(dtypeName(dtype)) + dimsToString(dims) + " would take " + std::to_string(static_cast<double>(n) * static_cast<double>(element) / 1e9) +
                    " GB, over the limit of " + std::to_string(limit) + " bytes for one tensor (--max-tensor-bytes)");
    return static_cast<size_t>(n) * element;
}

Tensor::Tensor(DType dtype, Dims dims) : dtype_(dtype), dims_(std::move(dims)) {
    data_ = allocateBytes(tensorBytes(dtype_, dims_, "tensor"));
    numel_ = numElements(dims_);
}

Tensor Tensor::uninitialized(DType dtype, Dims dims) {
    Tensor t;
    t.dtype_ = dtype;
    t.dims_ = std::move(dims);
    t.data_ = allocateBytes(tensorBytes(t.dtype_, t.dims_, "tensor"), false);
    t.numel_ = numElements(t.dims_);
    return t;
}

Tensor Tensor::alias(DType dtype, Dims dims, const std::shared_ptr<std::byte[]>& storage, size_t byte_offset) {
    Tensor t;
    t.dtype_ = dtype;
    t.dims_ = std::move(dims);
    t.numel_ = numElements(t.dims_);
    t.data_ = std::shared_ptr<std::byte[]>(storage, storage.get() + byte_offset);
    return t;
}

Tensor Tensor::reshaped(Dims dims) const {
    check(numElements(dims) == numel_, [&] { return "cannot reshape " + summary() + " to " + dimsToString(dims); });
    Tensor t = *this;
    t.dims_ = std::move(dims);
    return t;
}

Tensor Tensor::clone() const {
    Tensor t(dtype_, dims_);
    if (byteSize()) std::memcpy(t.raw(), raw(), byteSize());
    return t;
}

double Tensor::scalarAt(int64_t i) const {
    check(i >= 0 && i < numel_, "tensor index out of range");
    return dispatchDType(dtype_, "scalarAt", [&](auto tag) -> double {
        using T = typename decltype(tag)::type;
        return static_cast<double>(static_cast<const T*>(static_cast<const void*>(raw()))[i]);
    });
}

std::vector<int64_t> Tensor::toInt64Vector() const {
    check(isInteger(dtype_), [&] { return "expected an integer tensor, got " + summary(); });
    std::vector<int64_t> out(static_cast<size_t>(numel_));
    dispatchDType(dtype_, "toInt64Vector", [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* p = reinterpret_cast<const T*>(raw());
        for (int64_t i = 0; i < numel_; ++i) out[i] = static_cast<int64_t>(p[i]);
    });
    return out;
}

std::vector<double> Tensor::toDoubleVector() const {
    std::vector<double> out(static_cast<size_t>(numel_));
    for (int64_t i = 0; i < numel_; ++i) out[i] = scalarAt(i);
    return out;
}

std::string Tensor::summary() const { return std::string(dtypeName(dtype_)) + dimsToString(dims_); }

}  // namespace kiln
