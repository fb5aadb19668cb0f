// TopK, NonZero, NonMaxSuppression and the recurrent ops (LSTM, GRU, RNN) on the CUDA target,
// against the CPU reference executor. They skip without a GPU.
#include <gtest/gtest.h>

#include <random>

#include "cuda_test_helpers.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

ValueInfo f32Input(const std::string& name, const Dims& dims) { return {name, DType::F32, Shape::fromDims(dims)}; }

// Values on a coarse grid, so that ties are common.
Tensor coarse(const Dims& dims, std::mt19937& rng) {
    Tensor t = randomTensor(dims, rng, -4, 4);
    for (float& v : t.span<float>()) v = std::round(v * 2) / 2;
    return t;
}

// TopK along inner and last axes, largest and smallest, k from an attribute (opset 1) and
// from an input; ties keep the lower index first.
TEST(CudaSelection, TopKMatchesTheReferenceIncludingTies) {
    REQUIRE_GPU();
    std::mt19937 rng(61);
    std::vector<Graph> graphs;
    std::vector<TensorMap> inputs;
    struct Case {
        Dims dims;
        int64_t axis, k, largest;
    };
    for (const Case& c : {Case{{3, 37, 5}, 1, 7, 1}, Case{{3, 37, 5}, 1, 37, 0}, Case{{4, 300}, -1, 5, 1}, Case{{2, 5000}, 1, 100, 0}, Case{{6}, 0, 0, 1},
                         Case{{2, 20000}, 1, 150, 1}, Case{{3, 17000, 2}, 1, 40, 0}}) {
        Graph g = oneNode(Node{"topk", "TopK", "", {"x", "k"}, {"values", "indices"}, {}}, {f32Input("x", c.dims)});
        g.nodes[0].attrs.set("axis", c.axis);
        g.nodes[0].attrs.set("largest", c.largest);
        g.initializers["k"] = Tensor::fromVector<int64_t>({1}, {c.k});
        graphs.push_back(g);
        inputs.push_back({{"x", coarse(c.dims, rng)}});
    }
    Graph old = oneNode(Node{"topk1", "TopK", "", {"x"}, {"values", "indices"}, {}}, {f32Input("x", {5, 9})});
    old.opset = 9;
    old.nodes[0].attrs.set("k", int64_t{3});
    graphs.push_back(old);
    inputs.push_back({{"x", coarse({5, 9}, rng)}});
    expectExactOnGpu(graphs, inputs);
}

// NonZero over floats (negative zero counts as zero), Bool and int64, every rank up to 3,
// and an input without any; a second run with other data gets its own count.
TEST(CudaSelection, NonZeroMatchesTheReferenceRunAfterRun) {
    REQUIRE_GPU();
    std::mt19937 rng(62);
    auto sparse = [&](DType t, const Dims& dims, double density) {
        Tensor x(t, dims);
        std::uniform_real_distribution<float> u(0, 1);
        for (int64_t i = 0; i < x.numel(); ++i) {
            const bool hit = u(rng) < density;
            if (t == DType::F32) x.data<float>()[i] = hit ? u(rng) - 2.f : (i % 2 ? -0.f : 0.f);
            else if (t == DType::I64) x.data<int64_t>()[i] = hit ? static_cast<int64_t>(rng() % 100) - 200 : 0;
            else x.data<bool>()[i] = hit;
        }
        return x;
    };
    struct Case {
        DType t;
        Dims dims;
    };
    for (const Case& c : {Case{DType::F32, {3, 40, 7}}, Case{DType::Bool, {1000}}, Case{DType::I64, {13, 11}}, Case{DType::F32, {70000}}}) {
        Graph g = oneNode(Node{"nz", "NonZero", "", {"x"}, {"y"}, {}}, {{"x", c.t, Shape::fromDims(c.dims)}});
        const Engine engine = buildCuda(g, "precision.activations=f32");
        ExecutionContext ctx(engine);
        for (double density : {0.3, 0.0, 0.9, 0.3}) {
            const TensorMap in = {{"x", sparse(c.t, c.dims, density)}};
            const auto want = GraphExecutor(g).run(in);
            const auto got = ctx.run(in);
            ASSERT_EQ(got[0].dims(), want[0].dims()) << dtypeName(c.t) << " density " << density;
            EXPECT_EQ(got[0].toInt64Vector(), want[0].toInt64Vector()) << dtypeName(c.t) << " density " << density;
            EXPECT_TRUE(ctx.stats().cpu_nodes.empty());
        }
    }
}

// NonMaxSuppression with corner and center boxes, with and without a score threshold,
// several batches and classes, a limit of kept boxes and INT64_MAX ("no limit"), and rows
// longer than shared memory sorts (variants 4 and 5: sorted in global memory; coarse scores,
// so that ties are common). Variant 6's limit falls after the first tile of candidates.
TEST(CudaSelection, NonMaxSuppressionKeepsTheReferenceBoxes) {
    REQUIRE_GPU();
    std::mt19937 rng(63);
    std::vector<Graph> graphs;
    std::vector<TensorMap> inputs;
    for (int variant = 0; variant < 7; ++variant) {
        const int64_t batches = variant == 3 || variant == 5 ? 1 : 2, classes = variant == 5 ? 1 : 3;
        const int64_t spatial = variant == 3 || variant == 6 ? 3000 : (variant >= 4 ? 20000 + 37 * variant : 200);
        Tensor boxes(DType::F32, {batches, spatial, 4});
        std::uniform_real_distribution<float> pos(0, 100), size(2, 30);
        for (int64_t i = 0; i < batches * spatial; ++i) {
            float* b = boxes.data<float>() + i * 4;
            const float y = pos(rng), x = pos(rng), h = size(rng), w = size(rng);
            if (variant == 1) b[0] = x, b[1] = y, b[2] = w, b[3] = h;                   // center_point_box
            else if (i % 2) b[0] = y + h, b[1] = x + w, b[2] = y, b[3] = x;              // the other diagonal
            else b[0] = y, b[1] = x, b[2] = y + h, b[3] = x + w;
        }
        Tensor scores = variant >= 4 ? coarse({batches, classes, spatial}, rng) : randomTensor({batches, classes, spatial}, rng, 0, 1);
        Node n{"nms", "NonMaxSuppression", "", {"boxes", "scores", "max", "iou"}, {"selected"}, {}};
        if (variant != 2 && variant != 5) n.inputs.push_back("score");
        if (variant == 1) n.attrs.set("center_point_box", int64_t{1});
        Graph g = oneNode(n, {f32Input("boxes", boxes.dims()), f32Input("scores", scores.dims())});
        g.opset = 11;
        g.initializers["max"] = Tensor::fromVector<int64_t>({1}, {variant == 3 || variant == 5 ? INT64_MAX : (variant == 6 ? 300 : 10)});
        g.initializers["iou"] = Tensor::fromVector<float>({1}, {0.4f});
        g.initializers["score"] = Tensor::fromVector<float>({1}, {0.3f});
        graphs.push_back(g);
        inputs.push_back({{"boxes", boxes}, {"scores", scores}});
    }
    expectExactOnGpu(graphs, inputs);
}

// A recurrent node with random weights: X [S, B, I] (or [B, S, I] with layout 1), W, R, B
// and initial states as initializers.
Graph recurrentGraph(const std::string& op, const std::string& direction, int64_t layout, int64_t lbr, std::mt19937& rng, TensorMap& in) {
    const int64_t S = 9, B = 3, I = 10, H = 16, D = direction == "bidirectional" ? 2 : 1;
    const int64_t G = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
    Graph g;
    g.opset = 14;
    const Dims xd = layout ? Dims{B, S, I} : Dims{S, B, I};
    g.inputs = {f32Input("x", xd)};
    in["x"] = randomTensor(xd, rng, -1, 1);
    g.initializers["w"] = randomTensor({D, G * H, I}, rng, -0.4f, 0.4f);
    g.initializers["r"] = randomTensor({D, G * H, H}, rng, -0.4f, 0.4f);
    g.initializers["b"] = randomTensor({D, 2 * G * H}, rng, -0.3f, 0.3f);
    const Dims sd = layout ? Dims{B, D, H} : Dims{D, B, H};
    g.initializers["h0"] = randomTensor(sd, rng, -0.5f, 0.5f);
    g.initializers["c0"] = randomTensor(sd, rng, -0.5f, 0.5f);
    Node n{op, op, "", {"x", "w", "r", "b", "", "h0"}, {"y", "y_h"}, {}};
    if (op == "LSTM") n.inputs.push_back("c0"), n.outputs.push_back("y_c");
    n.attrs.set("hidden_size", H);
    n.attrs.set("direction", direction);
    n.attrs.set("layout", layout);
    if (op == "GRU") n.attrs.set("linear_before_reset", lbr);
    g.nodes = {n};
    for (const auto& o : n.outputs) g.outputs.push_back({o, DType::F32, {}});
    return g;
}

// LSTM, GRU (both reset forms) and RNN in every direction and both layouts, in f32 and f16
// engines, through capture and replay.
TEST(CudaSelection, RecurrentOpsMatchTheReference) {
    REQUIRE_GPU();
    std::mt19937 rng(64);
    struct Case {
        const char* op;
        const char* direction;
        int64_t layout, lbr;
    };
    for (const Case& c : {Case{"LSTM", "forward", 0, 0}, Case{"LSTM", "bidirectional", 1, 0}, Case{"LSTM", "reverse", 0, 0}, Case{"GRU", "bidirectional", 0, 1},
                          Case{"GRU", "forward", 1, 0}, Case{"GRU", "reverse", 0, 0}, Case{"RNN", "bidirectional", 0, 0}}) {
        TensorMap in;
        const Graph g = recurrentGraph(c.op, c.direction, c.layout, c.lbr, rng, in);
        const auto want = GraphExecutor(g).run(in);
        const std::string what = std::string(c.op) + " " + c.direction + " layout " + std::to_string(c.layout) + " lbr " + std::to_string(c.lbr);
        expectMatches(buildCuda(g, "precision.activations=f32", &in), in, want, 1e-5, what + " f32");
        expectMatches(buildCuda(g, "", &in), in, want, 5e-3, what + " f16");
    }
}

}  // namespace
