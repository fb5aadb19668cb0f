// Helpers of the pass tests: the default route, small graphs, and the check that a rewrite
// keeps a graph's outputs.
#pragma once
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/builder.h"
#include "runtime/accuracy.h"
#include "backends/cpu/graph_executor.h"
#include "test_helpers.h"

namespace kiln::testing {

inline RouteValues defaults() { return BuildRoute::defaults(Builder::space()).values(); }

inline std::vector<std::string> opTypes(const Graph& g) {
    std::vector<std::string> ops;
    for (const auto& n : g.nodes) ops.push_back(n.op_type);
    return ops;
}

inline Graph withInput(const Dims& dims) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims(dims)}};
    return g;
}

inline void scalar(Graph& g, const std::string& name, float v) { g.initializers[name] = Tensor::scalar<float>(v); }

// Runs the graph before and after the pass on a random input and compares.
inline void expectSameOutputs(const Graph& before, const Graph& after, const Dims& dims, double tol = 1e-5) {
    std::mt19937 rng(9);
    TensorMap in = {{"x", randomTensor(dims, rng, -2, 2)}};
    auto a = GraphExecutor(before).run(in), b = GraphExecutor(after).run(in);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(compareOutputs(b[i], a[i], "y").rel_l2, tol);
}

}  // namespace kiln::testing
