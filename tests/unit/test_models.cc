// Whole models against trusted outputs: the bundled models (numpy float64 references) and
// the real-architecture models in ../shared/models (PyTorch fp32 outputs), when present.
#include <gtest/gtest.h>

#include <filesystem>

#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/accuracy.h"
#include "backends/cpu/graph_executor.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {
void checkModel(const fs::path& dir, double max_rel_l2) {
    Graph g = importOnnxModel(dir / "model.onnx");
    TensorMap inputs;
    auto declared = g.runtimeInputs();
    for (size_t i = 0; i < declared.size(); ++i)
        inputs[declared[i].name] = loadTensorFile(dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb"));
    auto outputs = GraphExecutor(g).run(inputs);
    for (size_t i = 0; i < outputs.size(); ++i) {
        ErrorStats e = compareOutputs(outputs[i], loadTensorFile(dir / "test_data_set_0" / ("output_" + std::to_string(i) + ".pb")), g.outputs[i].name);
        EXPECT_LT(e.rel_l2, max_rel_l2) << dir << " output " << g.outputs[i].name;
        EXPECT_FALSE(e.nan_mismatch);
    }
}
}  // namespace

class BundledModel : public ::testing::TestWithParam<std::string> {};
TEST_P(BundledModel, MatchesFloat64Reference) { checkModel(fs::path(KILN_SOURCE_DIR) / "models" / GetParam(), 1e-5); }
INSTANTIATE_TEST_SUITE_P(Models, BundledModel, ::testing::Values("mlp", "small_cnn", "transformer_block"));

class SharedModel : public ::testing::TestWithParam<std::string> {};
TEST_P(SharedModel, MatchesPyTorchReference) {
    fs::path dir = fs::path(KILN_SHARED_DIR) / "models" / GetParam();
    if (!fs::exists(dir / "model.onnx")) GTEST_SKIP() << dir << " not present (shared models are optional)";
    checkModel(dir, 1e-4);
}
INSTANTIATE_TEST_SUITE_P(Models, SharedModel, ::testing::Values("mobilenet_v2", "bert_small", "vit_tiny", "gpt2_small"));
