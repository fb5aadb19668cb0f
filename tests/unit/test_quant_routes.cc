// Int8 as a route choice: precision.conv / precision.matmul = int8 and quant.skip_first_last
// quantize exactly their op classes from calibration ranges (Builder::setCalibration), and
// the tuner can weigh them against f32 under its accuracy gate.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "pass_test_helpers.h"
#include "quant/calibration.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"

namespace kiln::testing {
namespace {

// x -> Conv -> Relu -> Conv -> Relu -> Flatten -> MatMul -> y: two convs, then a matmul.
Graph convsThenMatMul(std::mt19937& rng) {
    Graph g = withInput({1, 4, 6, 6});
    g.opset = 17;
    g.initializers["w1"] = randomTensor({8, 4, 3, 3}, rng, -0.5f, 0.5f);
    g.initializers["w2"] = randomTensor({8, 8, 3, 3}, rng, -0.3f, 0.3f);
    g.initializers["wm"] = randomTensor({288, 10}, rng, -0.1f, 0.1f);
    Attributes pads;
    pads.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.nodes = {Node{"c1", "Conv", "", {"x", "w1"}, {"h1"}, pads}, Node{"r1", "Relu", "", {"h1"}, {"a1"}, {}},
               Node{"c2", "Conv", "", {"a1", "w2"}, {"h2"}, pads}, Node{"r2", "Relu", "", {"h2"}, {"a2"}, {}},
               Node{"f", "Flatten", "", {"a2"}, {"flat"}, {}},     Node{"m", "MatMul", "", {"flat", "wm"}, {"y"}, {}}};
    for (const char* v : {"h1", "a1", "h2", "a2"}) g.value_info[v] = {v, DType::F32, Shape::fromDims({1, 8, 6, 6})};
    g.value_info["flat"] = {"flat", DType::F32, Shape::fromDims({1, 288})};
    g.outputs = {{"y", DType::F32, Shape::fromDims({1, 10})}};
    return g;
}

struct Counts {
    long conv = 0, matmul = 0;
};

Counts integerOps(const Graph& g) {
    const auto ops = opTypes(g);
    Counts c;
    for (const auto& op : ops) {
        c.conv += op == "QLinearConv" || op == "QLinearConvNhwc";
        c.matmul += op == "QLinearMatMul";
    }
    return c;
}

BuildRoute routeWith(const std::vector<std::pair<std::string, std::string>>& values) {
    BuildRoute r = BuildRoute::defaults(Builder::space());
    for (const auto& [k, v] : values) r.set(k, v, Builder::space());
    return r;
}

TEST(QuantRoutes, EachPrecisionQuantizesItsOpClassOnly) {
    std::mt19937 rng(3);
    const Graph g = convsThenMatMul(rng);
    std::vector<TensorMap> samples;
    for (int k = 0; k < 4; ++k) samples.push_back({{"x", randomTensor({1, 4, 6, 6}, rng, -1.f, 1.f)}});
    auto table = std::make_shared<CalibrationTable>(calibrate(g, "hash", samples, "minmax"));
    const Tensor want = GraphExecutor(g).run(samples[0])[0];
    struct Case {
        std::vector<std::pair<std::string, std::string>> route;
        long convs, matmuls;
    };
    const std::vector<Case> cases = {
        {{}, 0, 0},
        {{{"precision.conv", "int8"}}, 2, 0},
        {{{"precision.matmul", "int8"}}, 0, 1},
        {{{"precision.conv", "int8"}, {"precision.matmul", "int8"}}, 2, 1},
        // The first conv and the last product (the matmul) stay f32.
        {{{"precision.conv", "int8"}, {"precision.matmul", "int8"}, {"quant.skip_first_last", "on"}}, 1, 0},
    };
    for (const auto& c : cases) {
        Builder b(g, "hash", "cpu");
        b.setCalibration(table);
        const BuildRoute route = routeWith(c.route);
        b.setBuildRoute(route);
        const Engine e = b.build();
        const Counts n = integerOps(e.graph);
        const std::string name = route.changesText(Builder::space());
        EXPECT_EQ(n.conv, c.convs) << name << "\n" << dumpGraph(e.graph);
        EXPECT_EQ(n.matmul, c.matmuls) << name << "\n" << dumpGraph(e.graph);
        ExecutionContext ctx(e);
        const ErrorStats err = compareOutputs(ctx.run(samples[0])[0], want, "y");
        EXPECT_LT(err.rel_l2, 0.05) << name;
        if (c.convs + c.matmuls > 0) EXPECT_GT(err.rel_l2, 1e-6) << name << ": quantized, so not exact";
        else EXPECT_LT(err.rel_l2, 1e-5) << name;
    }
}

TEST(QuantRoutes, Int8WithoutRangesOrForAnotherModelOrTargetIsRefusedOrWarned) {
    std::mt19937 rng(4);
    const Graph g = convsThenMatMul(rng);
    Builder none(g, "hash", "cpu");
    none.setBuildRoute(routeWith({{"precision.conv", "int8"}}));
    try {
        none.build();
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--calib"), std::string::npos) << e.what();
    }
    Builder other(g, "hash", "cpu");
    other.setCalibration(std::make_shared<CalibrationTable>(CalibrationTable{"another", "minmax", 1, {{"x", {-1, 1}}}}));
    other.setBuildRoute(routeWith({{"precision.matmul", "int8"}}));
    EXPECT_THROW(other.build(), Error);
    // The cuda target has no int8 kernels: the route keeps f32, with a warning.
    Builder cuda(g, "hash", "cuda");
    cuda.setBuildRoute(routeWith({{"precision.conv", "int8"}}));
    EXPECT_EQ(cuda.getBuildRoute().get("precision.conv"), "f32");
    ASSERT_EQ(cuda.warnings().size(), 1u);
    EXPECT_NE(cuda.warnings()[0].find("int8"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
