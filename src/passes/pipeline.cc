// The optimization pipeline: every pass, in order. Each reads its own parameters.
#include <set>

#include "passes/pass.h"

namespace kiln {

const std::vector<Pass>& passPipeline() {
    static const std::vector<Pass> pipeline = {
        identityEliminationPass(),
        constantFoldingPass(),
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

Graph optimizeGraph(const Graph& input, const RouteValues& route) {
    Graph g = input;
    for (const auto& pass : passPipeline()) {
        pass.run(g, route);
        try {
            topologicalSort(g);
            verifyGraph(g);
        } catch (const Error& e) {
            throw Error("pass " + pass.name + " produced an invalid graph: " + e.what());
        }
    }
    return g;
}

}  // namespace kiln
