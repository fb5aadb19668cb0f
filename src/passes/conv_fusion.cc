// Conv epilogue fusion: Conv (+ residual Add of a same-shaped tensor) (+ activation)
// becomes FusedConv(X, W, B, [Z]) {activation} in the kiln domain.
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

// Equal at run time: the same rank and, dim by dim, the same size or the same named symbol
// ("batch": a model exported with a symbolic batch keeps its residual Adds fused).
bool sameShapeAtRunTime(const Graph& g, const std::string& a, const std::string& b) {
    const ValueInfo* va = g.findValueInfo(a);
    const ValueInfo* vb = g.findValueInfo(b);
    if (!va || !vb || !va->shape.rank_known || va->shape != vb->shape) return false;
    for (const Dim& d : va->shape.dims)
        if (!d.known() && d.symbol.empty()) return false;
    return true;
}

void fuseConvBiasActivation(Graph& g, const RouteValues& route) {
    const bool fuse_act = routeOn(route, "fusion.conv_bias_act");
    const bool fuse_residual = routeOn(route, "fusion.conv_residual");
    if (!fuse_act && !fuse_residual) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& conv = g.nodes[i];
        if (conv.op_type != "Conv" || !conv.domain.empty() || erase[i]) continue;
        Node fused = conv;
        fused.name = freshName(g, conv.name + "_fused");
        fused.op_type = "FusedConv";
        fused.domain = "kiln";
        fused.inputs.resize(3);  // X, W, B ("" when absent); Z follows when fused
        bool changed = false;
        int c = index.soleConsumer(fused.outputs[0]);
        if (fuse_residual && c >= 0 && g.nodes[c].op_type == "Add" && !erase[c]) {
            const std::string z = otherInput(g.nodes[c], fused.outputs[0]);
            if (!z.empty() && z != fused.outputs[0] && sameShapeAtRunTime(g, z, fused.outputs[0])) {
                fused.inputs.push_back(z);
                fused.outputs[0] = g.nodes[c].outputs[0];
                erase[c] = true;
                changed = true;
                c = index.soleConsumer(fused.outputs[0]);
            }
        }
        std::string act;
        std::vector<float> params;
        int sigmoid = -1, mul = -1;
        if (fuse_act && c >= 0 && !erase[c] && fusableActivation(g, g.nodes[c], &act, &params)) {
            setActivation(fused, act, params);
            fused.outputs[0] = g.nodes[c].outputs[0];
            erase[c] = true;
            changed = true;
        } else if (fuse_act && siluOf(g, index, fused.outputs[0], &sigmoid, &mul) && !erase[sigmoid] && !erase[mul]) {
            setActivation(fused, "Silu", {});  // x * sigmoid(x): EfficientNet's and YOLO's activation
            fused.outputs[0] = g.nodes[mul].outputs[0];
            erase[sigmoid] = erase[mul] = true;
            changed = true;
        }
        if (!changed) continue;
        erase[i] = true;
        added.push_back(fused);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass convBiasActivationFusionPass() {
    return {"conv_bias_act_fusion",
            {{"fusion.conv_bias_act", {"on", "off"}, "on", "conv_bias_act_fusion", "Fuse an activation into the Conv that feeds it (FusedConv)"},
             {"fusion.conv_residual", {"on", "off"}, "on", "conv_bias_act_fusion", "Fuse a residual Add of a same-shaped tensor into the Conv epilogue"}},
            fuseConvBiasActivation};
}

}  // namespace kiln
