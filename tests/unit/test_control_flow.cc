// If, Loop and Scan: subgraphs that read outer values (captures), through the executor,
// the build pipeline and the engine file, against values worked out by hand.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "engine/builder.h"
#include "engine/coverage.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "backends/cpu/graph_executor.h"
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

// A branch that convolves with an outer weight and a loop body that multiplies by one are
// compiled like the top graph: the weights become the subgraphs' own constants, the conv and
// matmul get fast tactics (named under the subgraph's prefix), and the results equal the
// unoptimized graph's on the reference kernels, through a built and a reloaded engine.
TEST(ControlFlow, SubgraphsAreCompiledWithFastKernels) {
    std::mt19937 rng(11);
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({1, 4, 6, 6})}, {"cond", DType::Bool, Shape::fromDims({})}, {"v", DType::F32, Shape::fromDims({3, 8})}};
    g.initializers["w"] = randomTensor({8, 4, 3, 3}, rng);
    g.initializers["m"] = randomTensor({8, 8}, rng);
    g.initializers["trips"] = Tensor::scalar<int64_t>(3);
    Node conv{"conv", "Conv", "", {"x", "w"}, {"c"}, {}};
    conv.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    auto then_branch = subgraph("then", {}, {conv, Node{"relu", "Relu", "", {"c"}, {"t_out"}, {}}}, {"t_out"});
    auto else_branch = subgraph("else", {}, {Node{"neg", "Neg", "", {"x"}, {"e_pre"}, {}}, Node{"tile", "Concat", "", {"e_pre", "e_pre"}, {"e_out"}, {}}}, {"e_out"});
    else_branch->nodes[1].attrs.set("axis", int64_t{1});
    Node branch{"if", "If", "", {"cond"}, {"y"}, {}};
    branch.attrs.set("then_branch", then_branch);
    branch.attrs.set("else_branch", else_branch);
    // Loop: s <- tanh(s @ m) three times.
    auto body = subgraph("body", {{"i", DType::I64, Shape::fromDims({})}, {"go", DType::Bool, Shape::fromDims({})}, {"s", DType::F32, Shape::fromDims({3, 8})}},
                         {Node{"mm", "MatMul", "", {"s", "m"}, {"p"}, {}}, Node{"act", "Tanh", "", {"p"}, {"s_next"}, {}},
                          Node{"keep", "Identity", "", {"go"}, {"go_next"}, {}}},
                         {"go_next", "s_next"});
    Node loop{"loop", "Loop", "", {"trips", "", "v"}, {"z"}, {}};
    loop.attrs.set("body", body);
    g.nodes = {branch, loop};
    g.outputs = {{"y", DType::F32, {}}, {"z", DType::F32, {}}};
    liftCaptures(g);

    Builder b(g, "");
    const Engine built = b.build();
    const Node* built_if = nullptr;
    for (const auto& n : built.graph.nodes)
        if (n.op_type == "If") built_if = &n;
    ASSERT_NE(built_if, nullptr);
    EXPECT_EQ(built_if->attrs.getStrings("captures"), (std::vector<std::string>{"x"})) << "the weight stays a capture";
    for (const auto& [name, tactic] : built.tactics)
        if (name.starts_with("if/then_branch/") || name.starts_with("loop/body/mm")) EXPECT_NE(tactic, "reference") << name;
    EXPECT_TRUE(built.tactics.count("loop/body/mm")) << "no tactic chosen for the loop body's matmul";
    bool then_conv = false;  // fused with its Relu: "conv_fused"
    for (const auto& [name, tactic] : built.tactics) then_conv |= name.starts_with("if/then_branch/conv") && tactic != "reference";
    EXPECT_TRUE(then_conv) << "the then branch's convolution has no conv tactic";
    for (const auto& slow : referenceKernelNodes(built)) EXPECT_NE(slow.op, "Conv") << slow.node;

    const auto path = std::filesystem::temp_directory_path() / "kiln_control_flow_fast.engine";
    writeEngine(built, path);
    const Engine loaded = readEngine(path);
    std::filesystem::remove(path);
    const Tensor x = randomTensor({1, 4, 6, 6}, rng), v = randomTensor({3, 8}, rng);
    for (bool cond : {true, false}) {
        const TensorMap in{{"x", x}, {"cond", Tensor::scalar<bool>(cond)}, {"v", v}};
        const auto want = GraphExecutor(g).run(in);
        for (const auto& got : {ExecutionContext(built).run(in), ExecutionContext(loaded).run(in)}) {
            ASSERT_EQ(got.size(), 2u);
            for (size_t k = 0; k < 2; ++k) {
                ASSERT_EQ(got[k].dims(), want[k].dims()) << "output " << k << " cond " << cond;
                EXPECT_LT(compareOutputs(got[k], want[k], "out").rel_l2, 1e-5) << "output " << k << " cond " << cond;
            }
        }
    }
}
