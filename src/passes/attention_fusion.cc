// Fuses scaled dot-product attention
//   P = Softmax(MatMul(Q, Kt) * scale [+ mask], axis=-1); Y = MatMul(P, V)
// (scale may also be a Div) into Attention(Q, Kt, V [, mask]) {scale} in the kiln domain.
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

bool lastAxisSoftmax(const Graph& g, const Node& n) {
    if (n.op_type != "Softmax") return false;
    int64_t axis = n.attrs.getInt("axis", g.opset < 13 ? 1 : -1);
    if (axis == -1) return true;  // the last axis in every opset
    const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
    // Before opset 13 softmax flattened from `axis`; only the last axis is equivalent.
    return vi && vi->shape.rank_known && axis == static_cast<int64_t>(vi->shape.dims.size()) - 1;
}

void fuseAttention(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.attention")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& sm = g.nodes[i];
        if (!lastAxisSoftmax(g, sm)) continue;
        std::vector<int> matched = {static_cast<int>(i)};
        const int out_mm = index.soleConsumer(sm.outputs[0]);
        if (out_mm < 0 || g.nodes[out_mm].op_type != "MatMul" || g.nodes[out_mm].inputs[0] != sm.outputs[0]) continue;
        matched.push_back(out_mm);
        std::string cur = sm.inputs[0], mask;
        int p = index.producer(cur);
        if (p >= 0 && g.nodes[p].op_type == "Add" && index.singleUse(cur)) {
            const Node& add = g.nodes[p];
            int p0 = index.producer(add.inputs[0]);
            int which = (p0 >= 0 && (g.nodes[p0].op_type == "Mul" || g.nodes[p0].op_type == "Div" || g.nodes[p0].op_type == "MatMul")) ? 0 : 1;
            mask = add.inputs[1 - which];
            cur = add.inputs[which];
            matched.push_back(p);
            p = index.producer(cur);
        }
        double scale = 1.0;
        if (p >= 0 && (g.nodes[p].op_type == "Mul" || g.nodes[p].op_type == "Div") && index.singleUse(cur)) {
            const Node& sn = g.nodes[p];
            double v;
            int which = -1;
            if (scalarConstant(g, sn.inputs[1], &v)) which = 0;
            else if (sn.op_type == "Mul" && scalarConstant(g, sn.inputs[0], &v)) which = 1;
            if (which < 0 || v == 0) continue;
            scale = sn.op_type == "Mul" ? v : 1.0 / v;
            matched.push_back(p);
            cur = sn.inputs[which];
            p = index.producer(cur);
        }
        if (p < 0 || g.nodes[p].op_type != "MatMul" || !index.singleUse(cur)) continue;
        matched.push_back(p);
        const Node& qk = g.nodes[p];
        if (!claimNodes(erase, matched)) continue;
        Node att{freshName(g, sm.name + "_attention"), "Attention", "kiln", {qk.inputs[0], qk.inputs[1], g.nodes[out_mm].inputs[1]}, {g.nodes[out_mm].outputs[0]}, {}};
        if (!mask.empty()) att.inputs.push_back(mask);
        att.attrs.set("scale", static_cast<float>(scale));
        added.push_back(att);
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass attentionFusionPass() {
    return {"attention_fusion",
            {{"fusion.attention", {"on", "off"}, "on", "attention_fusion", "Fuse MatMul/scale/mask/Softmax/MatMul into one scaled dot-product Attention node"}},
            fuseAttention};
}

}  // namespace kiln
