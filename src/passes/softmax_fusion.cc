// Fuses decomposed softmax along the last axis, Exp(x [- ReduceMax(x)]) / ReduceSum(...),
// into one Softmax node.
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void fuseSoftmax(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.softmax")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& exp = g.nodes[i];
        if (exp.op_type != "Exp" || erase[i]) continue;
        const auto& uses = index.consumers(exp.outputs[0]);
        if (uses.size() != 2 || index.isGraphOutput(exp.outputs[0])) continue;
        int sum = -1, div = -1;
        for (int u : uses) {
            if (reducesLastAxis(g, g.nodes[u], "ReduceSum")) sum = u;
            if (g.nodes[u].op_type == "Div" && g.nodes[u].inputs[0] == exp.outputs[0]) div = u;
        }
        if (sum < 0 || div < 0 || g.nodes[div].inputs[1] != g.nodes[sum].outputs[0] || !index.singleUse(g.nodes[sum].outputs[0])) continue;
        std::string x = exp.inputs[0];
        std::vector<int> matched = {static_cast<int>(i), sum, div};
        // Optional max subtraction: Sub(x, ReduceMax(x)).
        int p = index.producer(x);
        if (p >= 0 && g.nodes[p].op_type == "Sub" && index.singleUse(x)) {
            int m = index.producer(g.nodes[p].inputs[1]);
            if (m >= 0 && reducesLastAxis(g, g.nodes[m], "ReduceMax") && g.nodes[m].inputs[0] == g.nodes[p].inputs[0] && index.singleUse(g.nodes[m].outputs[0])) {
                matched.insert(matched.end(), {p, m});
                x = g.nodes[p].inputs[0];
            }
        }
        if (!claimNodes(erase, matched)) continue;
        Node sm{freshName(g, exp.name + "_softmax"), "Softmax", "", {x}, {g.nodes[div].outputs[0]}, {}};
        sm.attrs.set("axis", int64_t{-1});
        added.push_back(sm);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass softmaxFusionPass() {
    return {"softmax_fusion", {{"fusion.softmax", {"on", "off"}, "on", "softmax_fusion", "Fuse Exp/ReduceSum/Div (with optional max subtraction) into Softmax"}}, fuseSoftmax};
}

}  // namespace kiln
