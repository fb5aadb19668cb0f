// Conversion between ONNX TensorProto and Kiln tensors, and tensor files (.pb / .npy).
#pragma once
#include <filesystem>
#include <string>

#include "ir/tensor.h"

namespace onnx {
class TensorProto;
}

namespace kiln {

// ONNX TensorProto.DataType number <-> DType; throws Error for types Kiln does not handle.
DType dtypeFromOnnx(int onnx_type, const std::string& what);
int dtypeToOnnx(DType t);

// Reads a TensorProto. External data is read relative to `base_dir`, and a location that
// escapes `base_dir` is refused.
Tensor tensorFromProto(const onnx::TensorProto& proto, const std::filesystem::path& base_dir);
void tensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto& proto);

// A tensor file: a serialized TensorProto (.pb) or a NumPy .npy file. `name` gets the
// TensorProto's name where there is one.
Tensor loadTensorFile(const std::filesystem::path& path, std::string* name = nullptr);
void saveTensorFile(const Tensor& t, const std::string& name, const std::filesystem::path& path);

}  // namespace kiln
