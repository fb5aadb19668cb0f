// Fuses HardSwish as exporters spell it out into one HardSwish node, which then fuses into
// the convolution before it like any activation:
//   x * relu6(x + 3) / 6   (Clip(0, 6) of Add(x, 3); the / 6 as Div or Mul by 1/6, before
//                           or after the multiplication by x: Paddle, TensorFlow)
//   x * HardSigmoid(x) with alpha 1/6, beta 0.5 (torch's hardsigmoid exported on its own)
// Every intermediate must have no other reader.
#include <cmath>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

bool near(double a, double b) { return std::fabs(a - b) <= 1e-5 * std::max(1.0, std::fabs(b)); }

// Is `n` a division of `v` by 6, or a multiplication by 1/6?
bool dividesBySix(const Graph& g, const Node& n, const std::string& v) {
    double c;
    if (n.op_type == "Div") return n.inputs.size() == 2 && n.inputs[0] == v && scalarConstant(g, n.inputs[1], &c) && near(c, 6.0);
    return n.op_type == "Mul" && n.inputs.size() == 2 && scalarConstant(g, otherInput(n, v), &c) && near(c, 1.0 / 6.0);
}

bool isMulOf(const Node& n, const std::string& a, const std::string& b) {
    return n.op_type == "Mul" && n.inputs.size() == 2 && ((n.inputs[0] == a && n.inputs[1] == b) || (n.inputs[0] == b && n.inputs[1] == a));
}

// From the relu6(x + 3) value `r` (or x * that, or that / 6), the node giving x * relu6(x + 3) / 6;
// -1 if the rest of the pattern is not there.
int matchRelu6Tail(const Graph& g, const GraphIndex& index, const std::string& r, const std::string& x, std::set<int>& matched) {
    const int a = index.soleConsumer(r);
    if (a < 0) return -1;
    const Node& first = g.nodes[a];
    int b = -1;
    if (isMulOf(first, r, x)) {  // (x * r) / 6
        b = index.soleConsumer(first.outputs[0]);
        if (b < 0 || !dividesBySix(g, g.nodes[b], first.outputs[0])) return -1;
    } else if (dividesBySix(g, first, r)) {  // x * (r / 6)
        b = index.soleConsumer(first.outputs[0]);
        if (b < 0 || !isMulOf(g.nodes[b], first.outputs[0], x)) return -1;
    } else {
        return -1;
    }
    matched.insert({a, b});
    return b;
}

void fuseHardSwishes(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.hardswish")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (!n.domain.empty() || n.outputs.size() != 1 || n.inputs.empty()) continue;
        std::set<int> matched = {static_cast<int>(i)};
        std::string x;
        int last = -1;
        std::string act;
        std::vector<float> params;
        if (n.op_type == "Clip" && fusableActivation(g, n, &act, &params) && params[0] == 0.0f && params[1] == 6.0f) {
            const int add = index.producer(n.inputs[0]);
            double three;
            if (add < 0 || !index.singleUse(n.inputs[0]) || g.nodes[add].op_type != "Add" || g.nodes[add].inputs.size() != 2) continue;
            const Node& plus = g.nodes[add];
            if (scalarConstant(g, plus.inputs[1], &three) && near(three, 3.0)) x = plus.inputs[0];
            else if (scalarConstant(g, plus.inputs[0], &three) && near(three, 3.0)) x = plus.inputs[1];
            else continue;
            matched.insert(add);
            last = matchRelu6Tail(g, index, n.outputs[0], x, matched);
        } else if (n.op_type == "HardSigmoid" && near(n.attrs.getFloat("alpha", 0.2f), 1.0 / 6.0) && near(n.attrs.getFloat("beta", 0.5f), 0.5)) {
            x = n.inputs[0];
            const int m = index.soleConsumer(n.outputs[0]);
            if (m < 0 || !isMulOf(g.nodes[m], n.outputs[0], x)) continue;
            matched.insert(m);
            last = m;
        }
        if (last < 0 || !claimNodes(erase, matched)) continue;
        added.push_back(Node{freshName(g, n.name + "_hardswish"), "HardSwish", "", {x}, {g.nodes[last].outputs[0]}, {}});
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass hardSwishFusionPass() {
    return {"hardswish_fusion",
            {{"fusion.hardswish", {"on", "off"}, "on", "hardswish_fusion", "Fuse x * relu6(x + 3) / 6 and x * HardSigmoid(x) into one HardSwish node"}},
            fuseHardSwishes};
}

}  // namespace kiln
