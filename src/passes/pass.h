// Graph passes. Each pass declares the parameters it reads (registered beside it) and
// rewrites the graph according to the route. passes/pipeline.cc lists them in order.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/parameter.h"

namespace kiln {

// The route values passes see also name the build's target under this key ("cpu", "cuda").
inline constexpr const char* kTargetKey = "build.target";
// The target the passes build for; "cpu" when the route names none (passes run on their own).
inline std::string passTarget(const RouteValues& route) {
    const auto it = route.find(kTargetKey);
    return it == route.end() ? "cpu" : it->second;
}

struct Pass {
    std::string name;
    std::vector<ParameterSpec> parameters;
    // Rewrites `g` in place; may leave nodes unsorted (the pipeline sorts and verifies).
    void (*run)(Graph& g, const RouteValues& route);
};

// The optimization pipeline in execution order.
const std::vector<Pass>& passPipeline();
// Every parameter the passes declare.
std::vector<ParameterSpec> passParameters();
// Runs every pass on a copy of `g`, verifying the graph after each one; then, the same way,
// for the CPU, on each subgraph (If, Loop, Scan), the outer constants it reads made its own.
Graph optimizeGraph(const Graph& g, const RouteValues& route);

// The passes, one per file.
Pass constantFoldingPass();
Pass deadCodeEliminationPass();
Pass commonSubexpressionPass();
Pass identityEliminationPass();
Pass reshapeChainPass();
Pass transposeCancelPass();
Pass batchNormFoldingPass();
Pass layerNormFusionPass();
Pass geluFusionPass();
Pass hardSwishFusionPass();
Pass attentionFusionPass();
Pass horizontalMatMulFusionPass();
Pass gemmBiasActivationFusionPass();
Pass convBiasActivationFusionPass();
Pass elementwiseChainFusionPass();
Pass precisionAssignmentPass();
Pass layoutAssignmentPass();
Pass padIntoConvPass();
Pass spatialMeanPoolPass();
Pass conv1dAsConv2dPass();
Pass einsumToMatMulPass();
Pass softmaxFusionPass();
Pass matmulWeightLayoutPass();
Pass qdqFusionPass();
Pass quantizedLayoutPass();
Pass quantizedLookupPass();

}  // namespace kiln
