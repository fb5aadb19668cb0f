// Elementwise float chains between a DequantizeLinear and a QuantizeLinear become table
// lookups: DQ -> f -> Q maps each of the 256 8-bit codes to one code, so for any chain f of
// unary ops and ops with scalar constants (activations, affine steps, HardSwish written out)
// the build computes those 256 results once, on the reference kernels, and the engine reads
// one byte per element instead of running DQ, the chain and Q in f32 (ONNX Runtime keeps
// such lookup tables for its quantized activations). Exact for the reference kernels' f32
// results; the fast kernels' f32 chains could only differ where a value lies within an ulp
// of a rounding tie. fusion.qdq_lookup=off keeps the float chains.
#include <set>

#include "backends/cpu/reference/kernel.h"
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

bool scalarQuantParams(const Graph& g, const Node& n) {
    if (!n.domain.empty() || n.inputs.size() != 3 || n.inputs[2].empty() || n.attrs.getInt("block_size", 0) != 0) return false;
    const Tensor* s = constantOf(g, n.inputs[1]);
    const Tensor* z = constantOf(g, n.inputs[2]);
    return s && z && s->numel() == 1 && z->numel() == 1 && s->dtype() == DType::F32 && isEightBitInteger(z->dtype());
}

// A chain step: the node transforms input `flow` elementwise; its other inputs are scalar
// constants (Clip's bounds among them).
bool chainStep(const Graph& g, const Node& n, const std::string& flow) {
    static const std::set<std::string> kOps = {"Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Gelu", "Erf", "Abs",
                                               "Neg", "Exp", "Log", "Sqrt", "Softplus", "Clip", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"};
    if (!n.domain.empty() || !kOps.count(n.op_type) || n.outputs.size() != 1) return false;
    bool seen = false;
    for (const auto& in : n.inputs) {
        if (in.empty()) continue;
        if (in == flow && !seen) {
            seen = true;
            continue;
        }
        const Tensor* c = constantOf(g, in);
        if (!c || c->numel() != 1 || c->dtype() != DType::F32) return false;
    }
    return seen;
}

// The 256 results of DQ -> chain -> Q, indexed by code minus the type's lowest value.
Tensor lookupTable(const Graph& g, const std::vector<const Node*>& nodes, DType in_type) {
    Tensor codes(in_type, {256});
    for (int i = 0; i < 256; ++i) {
        if (in_type == DType::U8) codes.data<uint8_t>()[i] = static_cast<uint8_t>(i);
        else codes.data<int8_t>()[i] = static_cast<int8_t>(i - 128);
    }
    Tensor flow = codes;
    for (const Node* n : nodes) {
        std::vector<const Tensor*> inputs;  // the constants, and the flowing values where the rest is
        for (const auto& in : n->inputs) inputs.push_back(in.empty() ? nullptr : constantOf(g, in) ? constantOf(g, in) : &flow);
        Tensor out = referenceKernels().find(n->op_type)(KernelContext{*n, inputs, g.opset, nullptr})[0];
        flow = out.reshaped({256});
    }
    return flow;
}

void fuseLookups(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.qdq_lookup")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& q = g.nodes[i];
        if (q.op_type != "QuantizeLinear" || !scalarQuantParams(g, q)) continue;
        // Up from the Q through single-use chain steps to a DQ.
        std::vector<int> chain;
        std::string v = q.inputs[0];
        int dq = -1;
        while (true) {
            const int p = index.producer(v);
            if (p < 0 || !index.singleUse(v)) break;
            const Node& n = g.nodes[p];
            if (n.op_type == "DequantizeLinear") {
                if (scalarQuantParams(g, n)) dq = p;
                break;
            }
            std::vector<std::string> flowing;  // a step has exactly one input that is not a constant
            for (const auto& in : n.inputs)
                if (!in.empty() && !constantOf(g, in)) flowing.push_back(in);
            if (flowing.size() != 1 || !chainStep(g, n, flowing[0])) break;
            const std::string flow = flowing[0];
            chain.push_back(p);
            v = flow;
        }
        if (dq < 0 || chain.empty()) continue;
        std::vector<int> matched = chain;
        matched.push_back(dq);
        matched.push_back(static_cast<int>(i));
        if (!claimNodes(erase, matched)) continue;
        std::vector<const Node*> steps = {&g.nodes[dq]};
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) steps.push_back(&g.nodes[*it]);
        steps.push_back(&q);
        const DType in_type = constantOf(g, g.nodes[dq].inputs[2])->dtype();
        Tensor table = lookupTable(g, steps, in_type);
        const std::string name = freshName(g, q.name + "_table");
        g.initializers[name] = std::move(table);
        added.push_back(Node{freshName(g, q.name + "_lookup"), "QuantizedLookup", "kiln", {g.nodes[dq].inputs[0], name}, {q.outputs[0]}, {}});
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass quantizedLookupPass() {
    return {"quantized_lookup",
            {{"fusion.qdq_lookup", {"on", "off"}, "on", "quantized_lookup",
              "Turn DequantizeLinear -> elementwise float ops -> QuantizeLinear into one 256-entry table lookup on the 8-bit codes", false,
              {"DequantizeLinear"}}},
            fuseLookups};
}

}  // namespace kiln
