// If, Loop and Scan: subgraphs that read outer values (captures), through the executor,
// the build pipeline and the engine file, against values worked out by hand.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/builder.h"
#include "runtime/context.h"
#include "runtime/executor.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

std::shared_ptr<Graph> subgraph(const std::string& name, std::vector<ValueInfo> inputs, std::vector<Node> nodes, std::vector<std::string> outputs) {
    auto g = std::make_shared<Graph>();
    g->name = name;
    g->opset = 17;
    g->inputs = std::move(inputs);
    g->nodes = std::move(nodes);
    for (auto& o : outputs) g->outputs.push_back({o, DType::Undefined, {}});
    return g;
}

// y = cond ? a * 3 : a + x, with a = x + x listed after the If (which must be scheduled
// after it); the else branch computes a + x in a nested If whose condition is always true.
Graph ifGraph() {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({3})}, {"cond", DType::Bool, Shape::fromDims({})}};
    auto then_branch = subgraph("then", {}, {Node{"t_mul", "Mul", "", {"a", "three"}, {"t_out"}, {}}}, {"t_out"});
    then_branch->initializers["three"] = Tensor::scalar<float>(3.0f);
    // The else branch nests an If whose branches read `x` and `a` from the top graph.
    auto inner_then = subgraph("inner_then", {}, {Node{"i_add", "Add", "", {"a", "x"}, {"i_out"}, {}}}, {"i_out"});
    auto inner_else = subgraph("inner_else", {}, {}, {"x"});
    Node inner{"inner_if", "If", "", {"always"}, {"e_out"}, {}};
    inner.attrs.set("then_branch", inner_then);
    inner.attrs.set("else_branch", inner_else);
    auto else_branch = subgraph("else", {}, {inner}, {"e_out"});
    else_branch->initializers["always"] = Tensor::scalar<bool>(true);
    Node outer{"if", "If", "", {"cond"}, {"y"}, {}};
    outer.attrs.set("then_branch", then_branch);
    outer.attrs.set("else_branch", else_branch);
    g.nodes = {outer, Node{"double", "Add", "", {"x", "x"}, {"a"}, {}}};
    g.outputs = {{"y", DType::F32, {}}};
    liftCaptures(g);
    topologicalSort(g);
    return g;
}

}  // namespace

TEST(ControlFlow, CapturesBecomeInputsAndOrderTheGraph) {
    const Graph g = ifGraph();
    ASSERT_EQ(g.nodes.size(), 2u);
    EXPECT_EQ(g.nodes[0].name, "double");
    const Node& n = g.nodes[1];
    EXPECT_EQ(n.inputs, (std::vector<std::string>{"cond", "a", "x"}));
    EXPECT_EQ(n.attrs.getStrings("captures"), (std::vector<std::string>{"a", "x"}));
    EXPECT_EQ(formalInputCount(n), 1u);
    const Graph& else_branch = *n.attrs.getGraph("else_branch");
    EXPECT_EQ(else_branch.nodes[0].attrs.getStrings("captures"), (std::vector<std::string>{"a", "x"}));
    verifyGraph(g);
}

TEST(ControlFlow, IfRunsTheChosenBranchThroughExecutorAndEngine) {
    const Graph g = ifGraph();
    std::mt19937 rng(7);
    const Tensor x = randomTensor({3}, rng);
    Builder b(g, "");
    const Engine built = b.build();
    const auto path = std::filesystem::temp_directory_path() / "kiln_control_flow_if.engine";
    writeEngine(built, path);
    const Engine loaded = readEngine(path);
    std::filesystem::remove(path);
    for (bool cond : {true, false}) {
        const TensorMap in{{"x", x}, {"cond", Tensor::scalar<bool>(cond)}};
        for (const auto& out : {GraphExecutor(g).run(in)[0], ExecutionContext(built).run(in)[0], ExecutionContext(loaded).run(in)[0]}) {
            ASSERT_EQ(out.numel(), 3);
            for (int i = 0; i < 3; ++i) {
                const double xi = x.data<float>()[i];
                EXPECT_NEAR(out.data<float>()[i], cond ? 6 * xi : 3 * xi, 1e-6) << "cond " << cond;
            }
        }
    }
}

// Loop: s <- s + x * i for i < 4 while s stays under 100, scanning s each step.
TEST(ControlFlow, LoopCarriesStateAndStacksScanOutputs) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({2})}, {"s0", DType::F32, Shape::fromDims({2})}};
    g.initializers["trips"] = Tensor::scalar<int64_t>(4);
    g.initializers["go"] = Tensor::scalar<bool>(true);
    auto body = subgraph("body", {{"i", DType::I64, Shape::fromDims({})}, {"c", DType::Bool, Shape::fromDims({})}, {"s", DType::F32, Shape::fromDims({2})}},
                         {Node{"cast", "Cast", "", {"i"}, {"fi"}, {}}, Node{"scale", "Mul", "", {"x", "fi"}, {"dx"}, {}},
                          Node{"add", "Add", "", {"s", "dx"}, {"s_next"}, {}}, Node{"sum", "ReduceSum", "", {"s_next"}, {"total"}, {}},
                          Node{"lt", "Less", "", {"total", "limit"}, {"c_next"}, {}}, Node{"copy", "Identity", "", {"s_next"}, {"scan"}, {}}},
                         {"c_next", "s_next", "scan"});
    body->nodes[0].attrs.set("to", std::string("f32"));
    body->nodes[3].attrs.set("keepdims", int64_t{0});
    body->initializers["limit"] = Tensor::scalar<float>(100.0f);
    body->outputs[2] = {"scan", DType::F32, Shape::fromDims({2})};
    Node loop{"loop", "Loop", "", {"trips", "go", "s0"}, {"s_final", "s_all"}, {}};
    loop.attrs.set("body", body);
    g.nodes = {loop};
    g.outputs = {{"s_final", DType::F32, {}}, {"s_all", DType::F32, {}}};
    liftCaptures(g);
    const Tensor x = Tensor::fromVector<float>({2}, {1.0f, 2.0f}), s0 = Tensor::fromVector<float>({2}, {0.5f, -1.0f});
    const auto out = GraphExecutor(g).run({{"x", x}, {"s0", s0}});
    // s after i = 0..3: s0 + x * (0, 1, 3, 6).
    ASSERT_EQ(out[1].dims(), (Dims{4, 2}));
    const float steps[] = {0, 1, 3, 6};
    for (int t = 0; t < 4; ++t)
        for (int k = 0; k < 2; ++k) EXPECT_FLOAT_EQ(out[1].data<float>()[t * 2 + k], s0.data<float>()[k] + x.data<float>()[k] * steps[t]);
    EXPECT_FLOAT_EQ(out[0].data<float>()[1], -1.0f + 2.0f * 6);
    // The condition ends it early: with x = 30, the sum passes 100 after the third step.
    const auto early = GraphExecutor(g).run({{"x", Tensor::fromVector<float>({2}, {30.0f, 30.0f})}, {"s0", s0}});
    EXPECT_EQ(early[1].dims(), (Dims{3, 2}));

    // No trips: the state passes through and the scan output is empty, shaped as declared.
    Graph none = g;
    none.initializers["trips"] = Tensor::scalar<int64_t>(0);
    const auto skipped = GraphExecutor(none).run({{"x", x}, {"s0", s0}});
    EXPECT_EQ(skipped[0].toDoubleVector(), s0.toDoubleVector());
    EXPECT_EQ(skipped[1].dims(), (Dims{0, 2}));

    g.nodes[0].inputs[0] = g.nodes[0].inputs[1] = "";
    try {
        GraphExecutor(g).run({{"x", x}, {"s0", s0}});
        FAIL() << "a loop without trip count or condition ran";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("never end"), std::string::npos) << e.what();
    }
}

// Scan: a running sum over axis 1 of x [2, 3] read in reverse, scanned out along axis 1.
TEST(ControlFlow, ScanFollowsAxesAndDirections) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"init", DType::F32, Shape::fromDims({2})}, {"x", DType::F32, Shape::fromDims({2, 3})}};
    auto body = subgraph("body", {{"acc", DType::F32, Shape::fromDims({2})}, {"col", DType::F32, Shape::fromDims({2})}},
                         {Node{"add", "Add", "", {"acc", "col"}, {"acc_next"}, {}}, Node{"copy", "Identity", "", {"acc_next"}, {"out"}, {}}}, {"acc_next", "out"});
    Node scan{"scan", "Scan", "", {"init", "x"}, {"final", "sums"}, {}};
    scan.attrs.set("body", body);
    scan.attrs.set("num_scan_inputs", int64_t{1});
    scan.attrs.set("scan_input_axes", std::vector<int64_t>{1});
    scan.attrs.set("scan_input_directions", std::vector<int64_t>{1});
    scan.attrs.set("scan_output_axes", std::vector<int64_t>{-1});
    g.nodes = {scan};
    g.outputs = {{"final", DType::F32, {}}, {"sums", DType::F32, {}}};
    liftCaptures(g);
    const Tensor x = Tensor::fromVector<float>({2, 3}, {1, 2, 3, 10, 20, 30});
    const auto out = GraphExecutor(g).run({{"init", Tensor::fromVector<float>({2}, {0, 100})}, {"x", x}});
    EXPECT_EQ(out[0].toDoubleVector(), (std::vector<double>{6, 160}));
    ASSERT_EQ(out[1].dims(), (Dims{2, 3}));
    // Reversed input: columns 3, 2, 1 are added in that order; output axis 1 in step order.
    EXPECT_EQ(out[1].toDoubleVector(), (std::vector<double>{3, 5, 6, 130, 150, 160}));
}
