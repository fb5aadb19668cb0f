// A dense, row-major tensor with shared, 64-byte-aligned storage. Copies share data;
// use clone() for a deep copy.
#pragma once
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "ir/dtype.h"
#include "ir/shape.h"

namespace kiln {

// Zero-filled, 64-byte aligned bytes (rounded up to the alignment).
std::shared_ptr<std::byte[]> allocateBytes(size_t bytes, bool zero = true);

// The most bytes one tensor may take: physical memory unless KILN_MAX_TENSOR_BYTES or
// setMaxTensorBytes (the CLI's --max-tensor-bytes) says otherwise. Checked before every
// allocation, so that a shape from a bad model or input file fails with an Error instead
// of exhausting memory.
size_t maxTensorBytes();
void setMaxTensorBytes(size_t bytes);
// The bytes of a `dtype` tensor of `dims`; throws Error naming `what` when the element
// count overflows or the bytes pass maxTensorBytes().
size_t tensorBytes(DType dtype, const Dims& dims, const std::string& what);

class Tensor {
public:
    Tensor() = default;
    Tensor(DType dtype, Dims dims);  // zero-filled
    // Uninitialized contents: for kernels that write every element.
    static Tensor uninitialized(DType dtype, Dims dims);

    DType dtype() const { return dtype_; }
    const Dims& dims() const { return dims_; }
    size_t rank() const { return dims_.size(); }
    int64_t numel() const { return numel_; }
    size_t byteSize() const { return static_cast<size_t>(numel_) * dtypeSize(dtype_); }
    bool defined() const { return dtype_ != DType::Undefined; }

    std::byte* raw() { return data_.get(); }
    const std::byte* raw() const { return data_.get(); }

    template <typename T>
    T* data() {
        checkType<T>();
        return reinterpret_cast<T*>(data_.get());
    }
    template <typename T>
    const T* data() const {
        checkType<T>();
        return reinterpret_cast<const T*>(data_.get());
    }
    template <typename T>
    std::span<T> span() { return {data<T>(), static_cast<size_t>(numel_)}; }
    template <typename T>
    std::span<const T> span() const { return {data<T>(), static_cast<size_t>(numel_)}; }

    // A tensor over bytes [offset, offset + size) of `storage`, sharing its ownership.
    static Tensor alias(DType dtype, Dims dims, const std::shared_ptr<std::byte[]>& storage, size_t byte_offset);
    // Same data, new dims with the same element count.
    Tensor reshaped(Dims dims) const;
    Tensor clone() const;
    // Element i converted to double / int64 (any dtype); for reading small shape tensors.
    double scalarAt(int64_t i) const;
    // All elements as int64 (integer tensors only); for shape-like inputs.
    std::vector<int64_t> toInt64Vector() const;
    // All elements converted to double (any dtype); for small parameter tensors.
    std::vector<double> toDoubleVector() const;
    std::string summary() const;  // "f32[2,3]"

    template <typename T>
    static Tensor fromVector(const Dims& dims, const std::vector<T>& values);
    template <typename T>
    static Tensor scalar(T value) { return fromVector<T>({}, {value}); }

private:
    template <typename T>
    void checkType() const {
        if (DTypeOf<T>::value != dtype_)
            throw Error("tensor access as " + std::string(dtypeName(DTypeOf<T>::value)) + " but it holds " + std::string(dtypeName(dtype_)));
    }

    DType dtype_ = DType::Undefined;
    Dims dims_;
    int64_t numel_ = 0;
    std::shared_ptr<std::byte[]> data_;
};

template <typename T>
Tensor Tensor::fromVector(const Dims& dims, const std::vector<T>& values) {
    Tensor t(DTypeOf<T>::value, dims);
    check(static_cast<int64_t>(values.size()) == t.numel(), "Tensor::fromVector: " + std::to_string(values.size()) + " values for shape " + dimsToString(dims));
    T* p = t.data<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    return t;
}

}  // namespace kiln
