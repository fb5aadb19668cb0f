// The reference target (backends/reference): the smallest backend behind the Backend
// interface. Engines built for it run every node on its reference kernel and match the
// models' saved ONNX Runtime outputs; its engine files carry its signature.
#include <gtest/gtest.h>

#include "backends/backend.h"
#include "engine/builder.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"

using namespace kiln;

namespace {
const std::string kModels = std::string(KILN_SOURCE_DIR) + "/models";
}  // namespace

TEST(ReferenceTarget, EnginesRunReferenceKernelsAndMatchSavedOutputs) {
    for (const std::string model : {"mlp", "small_cnn", "transformer_block"}) {
        const std::string dir = kModels + "/" + model;
        Builder b(importOnnxModel(dir + "/model.onnx"), modelFileHash(dir + "/model.onnx"), "reference");
        const Engine built = b.build();
        EXPECT_EQ(built.target, "reference/any");
        EXPECT_TRUE(built.tactics.empty()) << model;
        // Its engine file loads for its own target only.
        const std::string bytes = serializeEngine(built);
        const Engine e = deserializeEngine(bytes, "mem", "reference/any");
        EXPECT_THROW(deserializeEngine(bytes, "mem", targetSignature("cpu")), Error);
        ExecutionContext ctx(e);
        const auto out = ctx.run({{"x", loadTensorFile(dir + "/test_data_set_0/input_0.pb")}});
        ASSERT_EQ(out.size(), 1u);
        const ErrorStats err = compareOutputs(out[0], loadTensorFile(dir + "/test_data_set_0/output_0.pb"), model);
        EXPECT_LT(err.rel_l2, 1e-5) << model;
        EXPECT_EQ(ctx.stats().planner, "none");
    }
}

TEST(ReferenceTarget, IsRegisteredWithNoParametersOrPrecisionFlags) {
    const Backend& ref = backendFor("reference");
    EXPECT_EQ(ref.name(), "reference");
    EXPECT_TRUE(ref.parameters().empty());
    for (const char* precision : {"f16", "bf16", "int8"}) EXPECT_TRUE(ref.precisionParameters(precision).empty()) << precision;
    EXPECT_EQ(&backendFor("reference/any"), &ref);
}
