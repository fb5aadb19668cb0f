// Small helpers for tests: building ONNX models in memory, temp folders, random tensors.
#pragma once
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <random>
#include <string>

#include "ir/tensor.h"

namespace kiln::testing {

// A fresh empty folder under the system temp dir, removed by the destructor.
class TempDir {
public:
    TempDir();
    ~TempDir();
    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

private:
    std::filesystem::path path_;
};

// A model with one f32 input `x` of `shape`, one output `y`, and the given opset.
onnx::ModelProto makeModel(const std::vector<int64_t>& shape, int64_t opset = 17);
onnx::NodeProto* addNode(onnx::ModelProto& m, const std::string& op, const std::vector<std::string>& inputs,
                         const std::vector<std::string>& outputs);
void saveModel(const onnx::ModelProto& m, const std::filesystem::path& path);
void writeFile(const std::filesystem::path& path, const std::string& bytes);
std::string readFile(const std::filesystem::path& path);

Tensor randomTensor(const Dims& dims, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f);

// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int runCommand(const std::string& command, std::string* output);

}  // namespace kiln::testing
