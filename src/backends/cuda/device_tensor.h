// A tensor in device memory as the CUDA executor passes it between nodes.
#pragma once
#include <memory>

#include "ir/tensor.h"

namespace kiln::cuda {

struct DeviceTensor {
    DType dtype = DType::Undefined;    // element type in device memory
    DType logical = DType::Undefined;  // the graph's type (F32 values may be stored as f16/bf16)
    Dims dims;
    void* data = nullptr;
    // The value on the host, when it is known without a copy (constants, inputs, values the
    // CPU computed): shape arithmetic reads it instead of synchronizing with the device.
    std::shared_ptr<const Tensor> host;

    int64_t numel() const { return numElements(dims); }
    size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype); }
    template <typename T>
    T* as() const { return static_cast<T*>(data); }
};

}  // namespace kiln::cuda
