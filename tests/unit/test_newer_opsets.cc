// Models at opsets 19 to 21, as current exporters write them (tests/data/newer_opsets, made
// by scripts/make_newer_opset_tests.py with ONNX Runtime's outputs as the reference): each
// imports, and matches ONNX Runtime on the reference kernels and through a default-route
// engine (the fast CPU tactics).
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/builder.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "backends/cpu/graph_executor.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> caseNames() {
    std::vector<std::string> names;
    const fs::path root = fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "newer_opsets";
    if (fs::exists(root))
        for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace

class NewerOpset : public ::testing::TestWithParam<std::string> {};

TEST_P(NewerOpset, MatchesOnnxRuntime) {
    const fs::path dir = fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "newer_opsets" / GetParam();
    Graph g = importOnnxModel(dir / "model.onnx");
    EXPECT_GE(g.opset, 18);
    TensorMap inputs;
    const auto declared = g.runtimeInputs();
    for (size_t i = 0; i < declared.size(); ++i) inputs[declared[i].name] = loadTensorFile(dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb"));
    Builder builder(g, "newer-opset");
    const Engine engine = builder.build();
    ExecutionContext context(engine);
    const std::vector<std::pair<const char*, std::vector<Tensor>>> runs = {{"reference", GraphExecutor(g).run(inputs)}, {"default route", context.run(inputs)}};
    for (const auto& [how, outputs] : runs) {
        ASSERT_EQ(outputs.size(), g.outputs.size());
        for (size_t i = 0; i < outputs.size(); ++i) {
            const Tensor want = loadTensorFile(dir / "test_data_set_0" / ("output_" + std::to_string(i) + ".pb"));
            ASSERT_EQ(outputs[i].dims(), want.dims()) << how << " output " << i;
            const ErrorStats e = compareOutputs(outputs[i], want, g.outputs[i].name);
            EXPECT_LT(e.rel_l2, 1e-5) << how << " output " << g.outputs[i].name << " max-abs " << e.max_abs;
            EXPECT_FALSE(e.nan_mismatch) << how;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Models, NewerOpset, ::testing::ValuesIn(caseNames()));
