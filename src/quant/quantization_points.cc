// Where a float model is quantized: its weights as initializers, its BatchNorms folded, and
// the activations around each selected Conv, MatMul and Gemm (see qdq_insertion.h).
#include <algorithm>
#include <map>

#include "passes/pass.h"
#include "quant/qdq_insertion.h"

namespace kiln {

namespace {

bool constantF32(const Graph& g, const std::string& v, size_t min_rank) {
    auto it = g.initializers.find(v);
    return it != g.initializers.end() && it->second.dtype() == DType::F32 && it->second.rank() >= min_rank;
}

bool knownF32(const Graph& g, const std::string& v) {
    const ValueInfo* info = g.findValueInfo(v);
    return info && info->dtype == DType::F32;
}

}  // namespace

Graph withConstantsAsInitializers(const Graph& model) {
    Graph g = model;
    std::vector<Node> kept;
    for (auto& n : g.nodes) {
        if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 && n.attrs.has("value")) g.initializers[n.outputs[0]] = n.attrs.getTensor("value");
        else kept.push_back(std::move(n));
    }
    g.nodes = std::move(kept);
    // BatchNorms folded into the convs before them (what ONNX Runtime's quant_pre_process does):
    // the conv's output is then the value to quantize, not the BatchNorm's input.
    RouteValues route = {{"fusion.batchnorm_fold", "on"}, {"fusion.batchnorm_affine", "on"}};
    batchNormFoldingPass().run(g, route);
    topologicalSort(g);
    return g;
}

std::vector<size_t> quantizedProducts(const Graph& g, const QuantSelection& selection) {
    std::vector<size_t> all;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (!n.domain.empty() || n.inputs.size() < 2 || n.outputs.size() != 1) continue;
        const bool conv = n.op_type == "Conv" && constantF32(g, n.inputs[1], 3);
        const bool matmul = (n.op_type == "MatMul" || n.op_type == "Gemm") && constantF32(g, n.inputs[1], 2);
        if (conv || matmul) all.push_back(i);
    }
    std::vector<size_t> chosen;
    for (size_t k = 0; k < all.size(); ++k) {
        if (selection.skip_first_last && (k == 0 || k + 1 == all.size())) continue;
        const bool conv = g.nodes[all[k]].op_type == "Conv";
        if (conv ? selection.conv : selection.matmul) chosen.push_back(all[k]);
    }
    return chosen;
}

std::vector<std::string> quantizationPoints(const Graph& g, const QuantSelection& selection) {
    std::map<std::string, std::vector<int>> readers;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        for (const auto& in : g.nodes[i].inputs) readers[in].push_back(static_cast<int>(i));
    std::vector<std::string> points;
    auto add = [&](const std::string& v) {
        if (knownF32(g, v) && std::find(points.begin(), points.end(), v) == points.end()) points.push_back(v);
    };
    for (size_t i : quantizedProducts(g, selection)) {
        const Node& n = g.nodes[i];
        add(n.inputs[0]);
        std::string out = n.outputs[0];
        const auto& r = readers[out];
        // After a Relu or a Clip from 0 (ReLU6) that reads it alone: the Q then does their clamping.
        if (r.size() == 1) {
            const Node& act = g.nodes[static_cast<size_t>(r[0])];
            const bool from_zero = act.op_type == "Clip" && (act.attrs.has("min") ? act.attrs.getFloat("min", 1.f) == 0.f
                                                                                   : act.inputs.size() > 1 && g.initializers.count(act.inputs[1]) &&
                                                                                         g.initializers.at(act.inputs[1]).scalarAt(0) == 0.0);
            if (act.op_type == "Relu" || from_zero) out = act.outputs[0];
        }
        add(out);
    }
    return points;
}

}  // namespace kiln
