// If on the CUDA target: the condition computed on the device, the branch taken run on the
// device (a nested If inside it), against the CPU reference executor. Skips without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_helpers.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

std::shared_ptr<Graph> branch(const std::string& name, std::vector<Node> nodes, const std::string& output) {
    auto g = std::make_shared<Graph>();
    g->name = name;
    g->opset = 17;
    g->nodes = std::move(nodes);
    g->outputs.push_back({output, DType::Undefined, {}});
    return g;
}

// y = sum(x) > 0 ? x * 3 : (a + x, from a nested If whose condition is a constant), with
// a = x + x; and z = sum(x) > 0 ? an empty [0] tensor : x's first row (torchvision's
// "no boxes" branch).
Graph deviceConditionGraph(const Dims& dims) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims(dims)}};
    g.initializers["zero"] = Tensor::scalar<float>(0.f);
    g.initializers["first"] = Tensor::fromVector<int64_t>({1}, {0});
    auto then_branch = branch("then", {Node{"t_mul", "Mul", "", {"x", "three"}, {"t_out"}, {}}}, "t_out");
    then_branch->initializers["three"] = Tensor::scalar<float>(3.f);
    auto inner_then = branch("inner_then", {Node{"i_add", "Add", "", {"a", "x"}, {"i_out"}, {}}}, "i_out");
    auto inner_else = branch("inner_else", {}, "x");
    Node inner{"inner_if", "If", "", {"always"}, {"e_out"}, {}};
    inner.attrs.set("then_branch", inner_then);
    inner.attrs.set("else_branch", inner_else);
    auto else_branch = branch("else", {inner}, "e_out");
    else_branch->initializers["always"] = Tensor::scalar<bool>(true);
    Node outer{"if", "If", "", {"cond"}, {"y"}, {}};
    outer.attrs.set("then_branch", then_branch);
    outer.attrs.set("else_branch", else_branch);
    auto empty = branch("empty", {}, "none");
    empty->initializers["none"] = Tensor(DType::F32, {0});
    auto row = branch("row", {Node{"r_gather", "Gather", "", {"x", "first"}, {"r_out"}, {}}}, "r_out");
    Node second{"if2", "If", "", {"cond"}, {"z"}, {}};
    second.attrs.set("then_branch", empty);
    second.attrs.set("else_branch", row);
    Node sum{"sum", "ReduceSum", "", {"x"}, {"s"}, {}};
    sum.attrs.set("keepdims", int64_t{0});
    g.nodes = {outer, second, Node{"double", "Add", "", {"x", "x"}, {"a"}, {}}, sum, Node{"positive", "Greater", "", {"s", "zero"}, {"cond"}, {}}};
    g.outputs = {{"y", DType::F32, {}}, {"z", DType::F32, {}}};
    liftCaptures(g);
    topologicalSort(g);
    return g;
}

}  // namespace

// Both branches, run after run in one context (the branch changes between runs of one
// input shape), in f32 (exact) and in f16, and no node falls back to the host.
TEST(CudaControlFlow, IfRunsTheBranchTheDeviceChoseOnTheDevice) {
    REQUIRE_GPU();
    const Dims dims{64, 96};
    const Graph g = deviceConditionGraph(dims);
    std::mt19937 rng(91);
    const Tensor x = randomTensor(dims, rng, 0.1f, 1.f);
    Tensor minus_x = x.clone();  // a Tensor copy shares its buffer
    for (float& v : minus_x.span<float>()) v = -v;
    const std::vector<const Tensor*> runs{&x, &minus_x, &minus_x, &x, &x};
    std::vector<std::vector<Tensor>> want;
    for (const Tensor* in : runs) want.push_back(GraphExecutor(g).run({{"x", *in}}));
    for (const std::string route : {"precision.activations=f32", "precision.activations=f16"}) {
        const Engine engine = buildCuda(g, route);
        ExecutionContext ctx(engine);
        for (size_t run = 0; run < runs.size(); ++run) {
            const auto got = ctx.run({{"x", *runs[run]}});
            const std::string what = route + " run " + std::to_string(run) + (runs[run] == &x ? " (then)" : " (else)");
            ASSERT_EQ(got.size(), 2u) << what;
            EXPECT_EQ(want[run][1].dims(), (runs[run] == &x ? Dims{0} : Dims{1, dims[1]})) << what << ": the reference";
            for (size_t k = 0; k < 2; ++k) {
                ASSERT_EQ(got[k].dims(), want[run][k].dims()) << what << " output " << k << "; the engine's graph:\n" << dumpGraph(engine.graph);
                if (want[run][k].numel()) {
                    EXPECT_LT(compareOutputs(got[k], want[run][k], "if").rel_l2, route.ends_with("f32") ? 1e-7 : 1e-3) << what << " output " << k;
                }
            }
            for (const auto& n : ctx.stats().cpu_nodes) ADD_FAILURE() << what << ": node on the CPU: " << n;
        }
    }
}
