// Helpers of the CUDA tests: skip without a GPU, build a CUDA engine, compare its runs
// (record, capture, replay) with the reference executor.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/cuda_executor.h"
#include "engine/builder.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "backends/cpu/graph_executor.h"

namespace kiln::testing {

#define REQUIRE_GPU()                                                           \
    do {                                                                        \
        std::string why_;                                                       \
        if (!cuda::deviceAvailable(&why_)) GTEST_SKIP() << "no GPU: " << why_; \
    } while (0)

// With `inputs`, their shapes are the build's exact profile, so that tactics are timed and
// recorded even when the model's batch dim is symbolic.
inline Engine buildCuda(const Graph& g, const std::string& route, const TensorMap* inputs = nullptr) {
    Builder b(g, "test", "cuda");
    b.setBuildRoute(BuildRoute::parse(route, Builder::space()));
    if (inputs) {
        ShapeProfile profile;
        for (const auto& [name, t] : *inputs) profile[name] = ShapeRange{t.dims(), t.dims(), t.dims()};
        b.setShapeProfile(profile);
    }
    return b.build();
}

// Runs the engine three times (record, capture, replay) and checks each run against the
// reference outputs and the replays against the first run.
inline void expectMatches(const Engine& engine, const TensorMap& inputs, const std::vector<Tensor>& want, double max_rel_l2, const std::string& what,
                          bool graphs = true) {
    ExecutionContext ctx(engine);
    std::vector<Tensor> first;
    for (int run = 0; run < 3; ++run) {
        auto got = ctx.run(inputs);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
            ErrorStats e = compareOutputs(got[i], want[i], engine.graph.outputs[i].name);
            EXPECT_LT(e.rel_l2, max_rel_l2) << what << " run " << run << " output " << i;
            EXPECT_FALSE(e.nan_mismatch) << what;
            if (run == 0) first.push_back(got[i]);
            else EXPECT_EQ(compareOutputs(got[i], first[i], "replay").max_abs, 0.0) << what << ": run " << run << " differs from run 0";
        }
    }
    EXPECT_TRUE(ctx.stats().gpu);
    if (ctx.stats().cpu_nodes.empty()) {
        EXPECT_EQ(ctx.stats().graph_replayed, graphs) << what << ": CUDA graph replay on the third run";
    }
    for (const auto& n : ctx.stats().cpu_nodes) ADD_FAILURE() << what << ": node on the CPU: " << n;
}

// Runs each single-node graph on the GPU (f32 engine) and expects the reference's bytes, and
// no host fallback; an exception names the node's op.
inline void expectExactOnGpu(const std::vector<Graph>& graphs, const std::vector<TensorMap>& inputs) {
    for (size_t k = 0; k < graphs.size(); ++k) {
        const Graph& g = graphs[k];
        const std::string what = g.nodes.back().op_type + " " + g.nodes.back().name;
        try {
            const auto want = GraphExecutor(g).run(inputs[k]);
            const Engine engine = buildCuda(g, "precision.activations=f32");
            ExecutionContext ctx(engine);
            const auto got = ctx.run(inputs[k]);
            ASSERT_EQ(got.size(), want.size()) << what;
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_EQ(got[i].dtype(), want[i].dtype()) << what;
                ASSERT_EQ(got[i].dims(), want[i].dims()) << what;
                EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), got[i].byteSize()), 0) << what;
            }
            EXPECT_TRUE(ctx.stats().cpu_nodes.empty()) << what << ": " << (ctx.stats().cpu_nodes.empty() ? "" : ctx.stats().cpu_nodes[0]);
        } catch (const std::exception& e) {
            ADD_FAILURE() << what << ": " << e.what();
        }
    }
}

inline Graph oneNode(Node n, std::vector<ValueInfo> inputs) {
    Graph g;
    g.opset = 17;
    g.inputs = std::move(inputs);
    for (const auto& o : n.outputs) g.outputs.push_back({o, DType::Undefined, {}});
    g.nodes = {std::move(n)};
    return g;
}

}  // namespace kiln::testing
