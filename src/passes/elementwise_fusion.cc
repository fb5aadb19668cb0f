// Fuses chains of elementwise float ops (each intermediate used once) into one
// ElementwiseChain node in the kiln domain. The chain's first input flows through every
// step; a binary step reads one more node input, broadcast like numpy.
// Attributes: ops (op names), operand (input index per step, -1 for unary ones),
// swapped (1 when the extra operand is the left side), params (2 floats per step).
#include <set>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

const std::set<std::string>& binaryOps() {
    static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"};
    return ops;
}
const std::set<std::string>& unaryOps() {
    static const std::set<std::string> ops = {"Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Reciprocal",
                                              "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Gelu", "Softplus"};
    return ops;
}

bool isFloatValue(const Graph& g, const std::string& v) {
    const ValueInfo* vi = g.findValueInfo(v);
    if (vi) return vi->dtype == DType::F32;
    const Tensor* t = constantOf(g, v);
    return t && t->dtype() == DType::F32;
}

struct Step {
    std::string op;
    int64_t operand = -1;
    bool swapped = false;
    float p0 = 0, p1 = 0;
};

// Describes node `n` as a step applied to `flow` (known to be f32: chain ops keep their
// input's type); false if it cannot be a chain step.
bool asStep(const Graph& g, const Node& n, const std::string& flow, Step* s, std::string* extra) {
    if (!n.domain.empty() || n.outputs.size() != 1) return false;
    if (binaryOps().count(n.op_type) && n.inputs.size() == 2 && n.inputs[0] != n.inputs[1]) {
        if (!isFloatValue(g, n.inputs[0] == flow ? n.inputs[1] : n.inputs[0])) return false;
        s->op = n.op_type;
        s->swapped = n.inputs[1] == flow;
        *extra = s->swapped ? n.inputs[0] : n.inputs[1];
        return n.inputs[0] == flow || n.inputs[1] == flow;
    }
    if (!unaryOps().count(n.op_type) || n.inputs.empty() || n.inputs[0] != flow) return false;
    std::string name;
    std::vector<float> params;
    if (fusableActivation(g, n, &name, &params)) {
        s->op = name;
        if (!params.empty()) s->p0 = params[0];
        if (params.size() > 1) s->p1 = params[1];
        return true;
    }
    s->op = n.op_type;
    return n.inputs.size() == 1;
}

void fuseElementwiseChains(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.elementwise")) return;
    topologicalSort(g);
    GraphIndex index(g);
    std::vector<bool> taken(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (taken[i]) continue;
        Step first;
        std::string extra;
        // A chain starts at a step whose flow input is its first input, an f32 value.
        if (g.nodes[i].inputs.empty() || !isFloatValue(g, g.nodes[i].inputs[0])) continue;
        if (!asStep(g, g.nodes[i], g.nodes[i].inputs.empty() ? "" : g.nodes[i].inputs[0], &first, &extra)) continue;
        Node fused{freshName(g, g.nodes[i].name + "_chain"), "ElementwiseChain", "kiln", {g.nodes[i].inputs[0]}, {}, {}};
        std::vector<Step> steps;
        std::vector<size_t> members;
        size_t cur = i;
        Step s = first;
        std::string flow = g.nodes[i].inputs[0];
        while (true) {
            if (!extra.empty()) {
                s.operand = static_cast<int64_t>(fused.inputs.size());
                fused.inputs.push_back(extra);
            }
            steps.push_back(s);
            members.push_back(cur);
            flow = g.nodes[cur].outputs[0];
            int next = index.soleConsumer(flow);
            if (next < 0 || taken[next]) break;
            extra.clear();
            s = Step{};
            if (!asStep(g, g.nodes[next], flow, &s, &extra)) break;
            cur = static_cast<size_t>(next);
        }
        if (steps.size() < 2) continue;
        std::vector<std::string> ops;
        std::vector<int64_t> operands, swapped;
        std::vector<float> params;
        for (const auto& st : steps) {
            ops.push_back(st.op);
            operands.push_back(st.operand);
            swapped.push_back(st.swapped);
            params.insert(params.end(), {st.p0, st.p1});
        }
        fused.attrs.set("ops", ops);
        fused.attrs.set("operand", operands);
        fused.attrs.set("swapped", swapped);
        fused.attrs.set("params", params);
        fused.outputs = {flow};
        for (size_t m : members) taken[m] = true;
        added.push_back(fused);
    }
    eraseNodes(g, taken);
    for (auto& n : added) g.nodes.push_back(std::move(n));
}

}  // namespace

Pass elementwiseChainFusionPass() {
    return {"elementwise_fusion",
            {{"fusion.elementwise", {"on", "off"}, "on", "elementwise_fusion", "Fuse chains of elementwise float ops into one ElementwiseChain kernel"}},
            fuseElementwiseChains};
}

}  // namespace kiln
