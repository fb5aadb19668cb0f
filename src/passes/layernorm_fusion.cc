// Fuses the decomposed layer normalization
//   m = ReduceMean(x, -1); d = x - m; v = ReduceMean(d^2, -1); y = d / Sqrt(v + eps) * gamma [+ beta]
// into LayerNormalization(x, gamma, beta, axis=-1, epsilon=eps).
#include <cmath>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

struct Matcher {
    const Graph& g;
    const GraphIndex& index;
    std::set<int> matched;
    // The sole consumer of `value` if it is `op`; records it as matched.
    const Node* next(const std::string& value, const std::string& op) {
        int c = index.soleConsumer(value);
        if (c < 0 || g.nodes[c].op_type != op) return nullptr;
        matched.insert(c);
        return &g.nodes[c];
    }
};

void fuseLayerNorms(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.layernorm")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& mean = g.nodes[i];
        if (erase[i] || !reducesLastAxis(g, mean, "ReduceMean")) continue;
        Matcher m{g, index, {static_cast<int>(i)}};
        const std::string x = mean.inputs[0];
        const Node* sub = m.next(mean.outputs[0], "Sub");
        if (!sub || sub->inputs[0] != x) continue;
        const std::string d = sub->outputs[0];
        const auto& uses = index.consumers(d);
        if (uses.size() != 2 || index.isGraphOutput(d)) continue;
        const Node *sq = nullptr, *div = nullptr;
        for (int u : uses) {
            const Node& c = g.nodes[u];
            double e;
            if (c.op_type == "Pow" && c.inputs[0] == d && scalarConstant(g, c.inputs[1], &e) && e == 2.0) sq = &c;
            if (c.op_type == "Div" && c.inputs[0] == d) div = &c;
            m.matched.insert(u);
        }
        if (!sq || !div) continue;
        const Node* var = m.next(sq->outputs[0], "ReduceMean");
        if (!var || !reducesLastAxis(g, *var, "ReduceMean")) continue;
        const Node* add = m.next(var->outputs[0], "Add");
        double eps;
        if (!add || !scalarConstant(g, otherInput(*add, var->outputs[0]), &eps)) continue;
        const Node* sqrt = m.next(add->outputs[0], "Sqrt");
        if (!sqrt || index.soleConsumer(sqrt->outputs[0]) < 0 || &g.nodes[index.soleConsumer(sqrt->outputs[0])] != div || div->inputs[1] != sqrt->outputs[0]) continue;
        const Node* mul = m.next(div->outputs[0], "Mul");
        if (!mul) continue;
        const std::string gamma = otherInput(*mul, div->outputs[0]);
        const Tensor* gt = constantOf(g, gamma);
        if (!gt || gt->rank() != 1) continue;
        std::string out = mul->outputs[0], beta;
        if (const Node* badd = m.next(out, "Add")) {
            const Tensor* bt = constantOf(g, otherInput(*badd, out));
            if (bt && bt->rank() == 1) {
                beta = otherInput(*badd, out);
                out = badd->outputs[0];
            } else {
                m.matched.erase(index.soleConsumer(out));
            }
        }
        if (!claimNodes(erase, m.matched)) continue;
        Node ln{freshName(g, mean.name + "_layernorm"), "LayerNormalization", "", {x, gamma}, {out}, {}};
        if (!beta.empty()) ln.inputs.push_back(beta);
        ln.attrs.set("axis", int64_t{-1});
        ln.attrs.set("epsilon", static_cast<float>(eps));
        added.push_back(ln);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass layerNormFusionPass() {
    return {"layernorm_fusion",
            {{"fusion.layernorm", {"on", "off"}, "on", "layernorm_fusion", "Fuse decomposed layer normalization (ReduceMean/Sub/Pow/Sqrt/Div) into LayerNormalization"}},
            fuseLayerNorms};
}

}  // namespace kiln
