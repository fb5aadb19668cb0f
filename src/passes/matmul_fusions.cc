// GEMM fusions:
//  - horizontal: MatMuls that share their input and have constant 2-D weights become one
//    MatMul on the concatenated weights followed by a Split (e.g. Q/K/V projections);
//  - vertical: MatMul + bias Add (+ activation), and Gemm (+ activation), become one
//    FusedMatMul(A, B [, bias]) {trans_b, activation} in the kiln domain.
#include <algorithm>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void fuseHorizontalMatMuls(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.horizontal_matmul")) return;
    std::map<std::string, std::vector<size_t>> by_input;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        const Tensor* w = n.op_type == "MatMul" && n.domain.empty() ? constantOf(g, n.inputs[1]) : nullptr;
        if (w && w->rank() == 2 && w->dtype() == DType::F32) by_input[n.inputs[0]].push_back(i);
    }
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (const auto& [input, group] : by_input) {
        if (group.size() < 2) continue;
        const int64_t K = constantOf(g, g.nodes[group[0]].inputs[1])->dims()[0];
        std::vector<size_t> members;
        for (size_t i : group)
            if (constantOf(g, g.nodes[i].inputs[1])->dims()[0] == K) members.push_back(i);
        if (members.size() < 2) continue;
        int64_t total = 0;
        std::vector<int64_t> widths;
        for (size_t i : members) {
            widths.push_back(constantOf(g, g.nodes[i].inputs[1])->dims()[1]);
            total += widths.back();
        }
        Tensor w(DType::F32, {K, total});
        int64_t col = 0;
        for (size_t m = 0; m < members.size(); ++m) {
            const Tensor* part = constantOf(g, g.nodes[members[m]].inputs[1]);
            for (int64_t r = 0; r < K; ++r)
                for (int64_t c = 0; c < widths[m]; ++c) w.data<float>()[r * total + col + c] = part->data<float>()[r * widths[m] + c];
            col += widths[m];
        }
        const std::string base = g.nodes[members[0]].name + "_hfused";
        const std::string wname = freshName(g, base + "_weight"), yname = freshName(g, base + "_out"), sname = freshName(g, base + "_split");
        g.initializers[wname] = w;
        g.initializers[sname] = Tensor::fromVector<int64_t>({static_cast<int64_t>(widths.size())}, widths);
        added.push_back(Node{freshName(g, base), "MatMul", "", {input, wname}, {yname}, {}});
        Node split{freshName(g, base + "_split_node"), "Split", "", {yname, sname}, {}, {}};
        split.attrs.set("axis", int64_t{-1});
        for (size_t i : members) {
            split.outputs.push_back(g.nodes[i].outputs[0]);
            erase[i] = true;
        }
        added.push_back(split);
    }
    if (added.empty()) return;
    replaceNodes(g, erase, added);
    // Split takes its sizes as an input from opset 13; older graphs keep the attribute form.
    if (g.opset < 13)
        for (auto& n : g.nodes)
            if (n.op_type == "Split" && n.inputs.size() == 2 && g.initializers.count(n.inputs[1]) && n.name.find("_hfused") != std::string::npos) {
                n.attrs.set("split", g.initializers.at(n.inputs[1]).toInt64Vector());
                n.inputs.resize(1);
            }
}

// Appends an activation that is the sole consumer of fused.outputs[0], or of a Reshape that
// is (exporters put one between a 2-D Gemm and its GELU): an elementwise activation commutes
// with the reshape, which then produces the activation's output.
void absorbActivation(Graph& g, const GraphIndex& index, Node& fused, std::vector<bool>& erase) {
    int c = index.soleConsumer(fused.outputs[0]);
    int reshape = -1;
    if (c >= 0 && !erase[c] && g.nodes[c].op_type == "Reshape" && g.nodes[c].domain.empty() && g.nodes[c].inputs[0] == fused.outputs[0])
        reshape = c, c = index.soleConsumer(g.nodes[c].outputs[0]);
    std::string act;
    std::vector<float> params;
    int sigmoid = -1, mul = -1;
    if (reshape < 0 && siluOf(g, index, fused.outputs[0], &sigmoid, &mul) && !erase[sigmoid] && !erase[mul]) {
        setActivation(fused, "Silu", {});  // x * sigmoid(x), as Llama's MLP gate
        fused.outputs[0] = g.nodes[mul].outputs[0];
        erase[sigmoid] = erase[mul] = true;
        return;
    }
    if (c < 0 || erase[c] || !fusableActivation(g, g.nodes[c], &act, &params)) return;
    setActivation(fused, act, params);
    if (reshape >= 0) g.nodes[reshape].outputs[0] = g.nodes[c].outputs[0];
    else fused.outputs[0] = g.nodes[c].outputs[0];
    erase[c] = true;
}

// The shape a Reshape gives a [.., N] GEMM output, restated for the GEMM's [.., K] input:
// the Reshape then moves ahead of the GEMM. Only for a constant shape whose last entry is
// N itself and no 0 entries (which mean "copy" or, with allowzero, an empty dim).
bool reshapeForInput(const Graph& g, const Node& reshape, int64_t n, int64_t k, Tensor* out) {
    const Tensor* shape = reshape.inputs.size() == 2 ? constantOf(g, reshape.inputs[1]) : nullptr;
    if (!shape || shape->dtype() != DType::I64 || shape->rank() != 1 || shape->numel() < 2) return false;
    std::vector<int64_t> dims = shape->toInt64Vector();
    if (dims.back() != n || std::count(dims.begin(), dims.end(), 0)) return false;
    dims.back() = k;
    *out = Tensor::fromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
    return true;
}

// An Add of a computed tensor that is the sole consumer of an activation-free FusedMatMul
// joins it as the residual (input 3), and then an activation after that Add. Exporters often
// put a Reshape between the two (GPT-2: [B*S, N] -> [B, S, N]); with a constant 2-D weight
// that Reshape moves to the GEMM's input, where it is a free view either way.
void absorbResidual(Graph& g, const GraphIndex& index, Node& fused, std::vector<bool>& erase, std::vector<Node>& added) {
    if (!fused.attrs.getString("activation", "").empty()) return;
    int c = index.soleConsumer(fused.outputs[0]);
    int reshape = -1;
    if (c >= 0 && !erase[c] && g.nodes[c].op_type == "Reshape" && g.nodes[c].domain.empty() && g.nodes[c].inputs[0] == fused.outputs[0])
        reshape = c, c = index.soleConsumer(g.nodes[c].outputs[0]);
    if (c < 0 || erase[c] || g.nodes[c].op_type != "Add" || !g.nodes[c].domain.empty()) return;
    const Node& add = g.nodes[c];
    const std::string via = reshape >= 0 ? g.nodes[reshape].outputs[0] : fused.outputs[0];
    const std::string other = otherInput(add, via);
    if (other.empty() || other == via || constantOf(g, other)) return;
    if (reshape >= 0) {
        const Tensor* w = constantOf(g, fused.inputs[1]);
        if (!w || w->rank() != 2) return;
        const bool trans_b = fused.attrs.getInt("trans_b", 0) != 0;
        Tensor shape;
        if (!reshapeForInput(g, g.nodes[reshape], w->dims()[trans_b ? 0 : 1], w->dims()[trans_b ? 1 : 0], &shape)) return;
        const std::string sname = freshName(g, fused.name + "_input_shape"), aname = freshName(g, fused.name + "_input");
        g.initializers[sname] = shape;
        added.push_back(Node{freshName(g, fused.name + "_input_reshape"), "Reshape", "", {fused.inputs[0], sname}, {aname}, {}});
        fused.inputs[0] = aname;
        erase[reshape] = true;
    }
    fused.inputs.resize(3);  // "" when there is no bias
    fused.inputs.push_back(other);
    fused.outputs[0] = add.outputs[0];
    erase[c] = true;
    absorbActivation(g, index, fused, erase);
}

void fuseGemmBiasActivation(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.gemm_bias_act")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (erase[i] || !n.domain.empty() || (n.op_type != "Gemm" && n.op_type != "MatMul") || n.inputs.size() < 2) continue;
        Node fused{freshName(g, n.name + "_fused"), "FusedMatMul", "kiln", {n.inputs[0], n.inputs[1]}, {n.outputs[0]}, {}};
        if (n.op_type == "Gemm") {
            if (n.attrs.getInt("transA", 0) || n.attrs.getFloat("alpha", 1) != 1.0f || n.attrs.getFloat("beta", 1) != 1.0f) continue;
            const Tensor* c = n.hasInput(2) ? constantOf(g, n.inputs[2]) : nullptr;
            if (n.hasInput(2) && (!c || c->rank() != 1)) continue;
            fused.attrs.set("trans_b", n.attrs.getInt("transB", 0));
            if (c) fused.inputs.push_back(n.inputs[2]);
        } else if (n.op_type == "MatMul") {
            const Tensor* w = constantOf(g, n.inputs[1]);
            int add = index.soleConsumer(n.outputs[0]);
            if (!w || w->rank() != 2 || add < 0 || g.nodes[add].op_type != "Add" || erase[add]) continue;
            const Tensor* bias = constantOf(g, otherInput(g.nodes[add], n.outputs[0]));
            if (!bias || bias->rank() != 1 || bias->dims()[0] != w->dims()[1]) continue;
            fused.attrs.set("trans_b", int64_t{0});
            fused.inputs.push_back(otherInput(g.nodes[add], n.outputs[0]));
            fused.outputs[0] = g.nodes[add].outputs[0];
            erase[add] = true;
        } else {
            continue;
        }
        erase[i] = true;
        absorbActivation(g, index, fused, erase);
        absorbResidual(g, index, fused, erase, added);
        added.push_back(fused);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass horizontalMatMulFusionPass() {
    return {"horizontal_matmul_fusion",
            {{"fusion.horizontal_matmul", {"on", "off"}, "off", "horizontal_matmul_fusion", "Merge MatMuls that share an input and have constant weights into one MatMul + Split"}},
            fuseHorizontalMatMuls};
}

Pass gemmBiasActivationFusionPass() {
    return {"gemm_bias_act_fusion",
            {{"fusion.gemm_bias_act", {"on", "off"}, "on", "gemm_bias_act_fusion", "Fuse MatMul/Gemm with its bias add and activation into FusedMatMul"}},
            fuseGemmBiasActivation};
}

}  // namespace kiln
