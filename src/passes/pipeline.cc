// The optimization pipeline: every pass, in order. Each reads its own parameters.
#include <set>

#include "passes/pass.h"

namespace kiln {

const std::vector<Pass>& passPipeline() {
    static const std::vector<Pass> pipeline = {
        identityEliminationPass(),
        qdqFusionPass(),  // before constant folding dequantizes the weights
        constantFoldingPass(),
        quantizedLayoutPass(),  // after folding: exporters' scalar constants are initializers by then
        commonSubexpressionPass(),
        reshapeChainPass(),
        transposeCancelPass(),
        padIntoConvPass(),
        einsumToMatMulPass(),
        conv1dAsConv2dPass(),
        spatialMeanPoolPass(),
        batchNormFoldingPass(),
        layerNormFusionPass(),
        geluFusionPass(),
        hardSwishFusionPass(),
        quantizedLookupPass(),  // after the activation fusions: HardSwish and GELU written out read x twice
        softmaxFusionPass(),
        attentionFusionPass(),
        horizontalMatMulFusionPass(),
        gemmBiasActivationFusionPass(),
        matmulWeightLayoutPass(),
        convBiasActivationFusionPass(),
        layoutAssignmentPass(),
        transposeCancelPass(),  // again: removes transposes between channels-last convs
        elementwiseChainFusionPass(),
        precisionAssignmentPass(),
        deadCodeEliminationPass(),
    };
    return pipeline;
}

std::vector<ParameterSpec> passParameters() {
    std::vector<ParameterSpec> out;
    std::set<std::string> seen;
    for (const auto& pass : passPipeline())
        for (const auto& p : pass.parameters)
            if (seen.insert(p.name).second) out.push_back(p);
    return out;
}

namespace {

// `outer`: the names a subgraph reads from around it (its captures).
Graph optimizeIn(const Graph& input, const RouteValues& route, const std::set<std::string>& outer, bool nested);

// Subgraphs (If branches, Loop and Scan bodies) go through the whole pipeline as graphs of
// their own, after the graph around them, so that their nodes get fast kernels too. On CPU
// only: a CUDA engine runs its branches as imported, on the device's kernels for ONNX ops
// (and, for the few it lacks, the host's reference kernels).
void optimizeSubgraphs(Graph& g, const RouteValues& route) {
    if (passTarget(route) != "cpu") return;
    bool sunk = false;
    for (auto& node : g.nodes) {
        const auto attrs = subgraphAttributes(node);
        if (attrs.empty()) continue;
        const size_t before = node.inputs.size();
        sinkCapturedConstants(g, node);
        sunk |= node.inputs.size() != before;
        const auto captures = node.attrs.getStrings("captures");
        const std::set<std::string> outer(captures.begin(), captures.end());
        for (const auto& name : attrs) node.attrs.set(name, std::make_shared<Graph>(optimizeIn(*node.attrs.getGraph(name), route, outer, true)));
    }
    if (sunk) deadCodeEliminationPass().run(g, route);  // constants only the subgraphs read
}

Graph optimizeIn(const Graph& input, const RouteValues& route, const std::set<std::string>& outer, bool nested) {
    Graph g = input;
    auto verify = [&](const std::string& pass) {
        try {
            topologicalSort(g);
            verifyGraph(g, outer);
        } catch (const Error& e) {
            throw Error("pass " + pass + " produced an invalid graph" + (!nested ? "" : " (subgraph '" + g.name + "')") + ": " + e.what());
        }
    };
    for (const auto& pass : passPipeline()) {
        pass.run(g, route);
        verify(pass.name);
    }
    optimizeSubgraphs(g, route);
    verify("subgraph optimization");
    return g;
}

}  // namespace

Graph optimizeGraph(const Graph& input, const RouteValues& route) { return optimizeIn(input, route, {}, false); }

}  // namespace kiln
