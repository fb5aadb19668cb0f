// Fuses GELU subgraphs into one Gelu node:
//   erf form:  x * 0.5 * (1 + Erf(x / sqrt(2)))
//   tanh form: x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
// in the three multiplication orders exporters produce.
#include <cmath>
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

bool near(double a, double b) { return std::fabs(a - b) <= 1e-4 * std::fabs(b); }

// The producer of `value` if it is `op` with one use; nullptr otherwise.
const Node* producerOf(const Graph& g, const GraphIndex& index, const std::string& value, const std::string& op) {
    int p = index.producer(value);
    if (p < 0 || g.nodes[p].op_type != op || !index.singleUse(value)) return nullptr;
    return &g.nodes[p];
}

// Is `n` a Mul of `x` by the scalar `c`?
bool mulByScalar(const Graph& g, const Node& n, const std::string& x, double c) {
    double v;
    return n.op_type == "Mul" && scalarConstant(g, otherInput(n, x), &v) && near(v, c);
}

// From the (1 + f(x)) value `a`, matches the multiplications by x and 0.5. Returns the node
// index whose output is the GELU result, or -1; adds matched node indices to `matched`.
int matchTail(const Graph& g, const GraphIndex& index, const std::string& a, const std::string& x, std::set<int>& matched) {
    int m1 = index.soleConsumer(a);
    if (m1 < 0 || g.nodes[m1].op_type != "Mul") return -1;
    const Node& mul1 = g.nodes[m1];
    const std::string other = otherInput(mul1, a);
    double v;
    if (other == x) {  // (x * a) * 0.5
        int m2 = index.soleConsumer(mul1.outputs[0]);
        if (m2 < 0 || !mulByScalar(g, g.nodes[m2], mul1.outputs[0], 0.5)) return -1;
        matched.insert({m1, m2});
        return m2;
    }
    if (scalarConstant(g, other, &v) && near(v, 0.5)) {  // x * (a * 0.5)
        int m2 = index.soleConsumer(mul1.outputs[0]);
        if (m2 < 0 || g.nodes[m2].op_type != "Mul" || otherInput(g.nodes[m2], mul1.outputs[0]) != x) return -1;
        matched.insert({m1, m2});
        return m2;
    }
    const Node* half = producerOf(g, index, other, "Mul");  // (x * 0.5) * a
    if (!half || !mulByScalar(g, *half, x, 0.5)) return -1;
    matched.insert({m1, index.producer(other)});
    return m1;
}

// For Erf: input is x / sqrt(2) or x * (1/sqrt(2)). Returns x or "".
std::string erfArgument(const Graph& g, const GraphIndex& index, const Node& erf, std::set<int>& matched) {
    int p = index.producer(erf.inputs[0]);
    if (p < 0 || !index.singleUse(erf.inputs[0])) return "";
    const Node& n = g.nodes[p];
    double v;
    if (n.op_type == "Div" && scalarConstant(g, n.inputs[1], &v) && near(v, std::sqrt(2.0))) {
        matched.insert(p);
        return n.inputs[0];
    }
    for (const auto& x : n.inputs)
        if (mulByScalar(g, n, x, 1 / std::sqrt(2.0))) {
            matched.insert(p);
            return x;
        }
    return "";
}

// For Tanh: input is c1 * (x + c2 * x^3). Returns x or "".
std::string tanhArgument(const Graph& g, const GraphIndex& index, const Node& tanh, std::set<int>& matched) {
    const Node* outer = producerOf(g, index, tanh.inputs[0], "Mul");
    if (!outer) return "";
    for (const auto& inner_v : outer->inputs) {
        if (!mulByScalar(g, *outer, inner_v, std::sqrt(2.0 / M_PI))) continue;
        const Node* add = producerOf(g, index, inner_v, "Add");
        if (!add) return "";
        for (const auto& x : add->inputs) {
            const Node* cube_mul = producerOf(g, index, otherInput(*add, x), "Mul");
            if (!cube_mul) continue;
            for (const auto& pow_v : cube_mul->inputs) {
                if (!mulByScalar(g, *cube_mul, pow_v, 0.044715)) continue;
                const Node* pow = producerOf(g, index, pow_v, "Pow");
                double e;
                if (!pow || pow->inputs[0] != x || !scalarConstant(g, pow->inputs[1], &e) || e != 3.0) continue;
                matched.insert({index.producer(tanh.inputs[0]), index.producer(inner_v), index.producer(otherInput(*add, x)), index.producer(pow_v)});
                return x;
            }
        }
    }
    return "";
}

void fuseGelus(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.gelu")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& f = g.nodes[i];
        if (f.op_type != "Erf" && f.op_type != "Tanh") continue;
        std::set<int> matched = {static_cast<int>(i)};
        const bool is_erf = f.op_type == "Erf";
        std::string x = is_erf ? erfArgument(g, index, f, matched) : tanhArgument(g, index, f, matched);
        if (x.empty()) continue;
        int a = index.soleConsumer(f.outputs[0]);
        double one;
        if (a < 0 || g.nodes[a].op_type != "Add" || !scalarConstant(g, otherInput(g.nodes[a], f.outputs[0]), &one) || one != 1.0) continue;
        matched.insert(a);
        int last = matchTail(g, index, g.nodes[a].outputs[0], x, matched);
        if (last < 0) continue;
        if (!claimNodes(erase, matched)) continue;
        Node gelu{freshName(g, f.name + "_gelu"), "Gelu", "", {x}, {g.nodes[last].outputs[0]}, {}};
        gelu.attrs.set("approximate", std::string(is_erf ? "none" : "tanh"));
        added.push_back(gelu);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass geluFusionPass() {
    return {"gelu_fusion", {{"fusion.gelu", {"on", "off"}, "on", "gelu_fusion", "Fuse erf and tanh GELU subgraphs into one Gelu node"}}, fuseGelus};
}

}  // namespace kiln
