#include "ir/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace kiln {

namespace {
constexpr size_t kAlignment = 64;  // cache line; lets SIMD kernels use aligned loads

}  // namespace

std::shared_ptr<std::byte[]> allocateBytes(size_t bytes, bool zero) {
    size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p) throw std::bad_alloc();
    if (zero) std::memset(p, 0, rounded);
    return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

Tensor::Tensor(DType dtype, Dims dims) : dtype_(dtype), dims_(std::move(dims)) {
    for (int64_t d : dims_) check(d >= 0, [&] { return "tensor dimension must be non-negative, got " + dimsToString(dims_); });
    numel_ = numElements(dims_);
    data_ = allocateBytes(byteSize());
}

Tensor Tensor::uninitialized(DType dtype, Dims dims) {
    Tensor t;
    t.dtype_ = dtype;
    t.dims_ = std::move(dims);
    for (int64_t d : t.dims_) check(d >= 0, [&] { return "tensor dimension must be non-negative, got " + dimsToString(t.dims_); });
    t.numel_ = numElements(t.dims_);
    t.data_ = allocateBytes(t.byteSize(), false);
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
