// ONNX model -> Kiln IR graph.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

constexpr int64_t kMinOpset = 1;
constexpr int64_t kMaxOpset = 21;

// Loads an .onnx file (external data is read from the model's folder), checks every node
// against the supported operator set and reports all unsupported nodes in one Error, runs
// ONNX shape inference to annotate value types, and returns a verified, sorted graph.
// Readers that take only a graph's structure and weights, never running it (the LLM
// decoder's), may accept newer opsets than the kernels implement (kReadOnlyMaxOpset).
Graph importOnnxModel(const std::filesystem::path& path, int64_t max_opset = kMaxOpset);
constexpr int64_t kReadOnlyMaxOpset = 21;

// Operators the importer accepts, with the first default-domain opset that defines them.
struct OpSupport {
    const char* op_type;
    int64_t since_opset;
};
const std::vector<OpSupport>& supportedOps();
bool isSupportedOp(const std::string& domain, const std::string& op_type, int64_t opset);

}  // namespace kiln
