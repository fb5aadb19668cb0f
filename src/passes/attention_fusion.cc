// Fuses scaled dot-product attention
//   P = Softmax(MatMul(Q, Kt) * scale [+ mask], axis=-1); Y = MatMul(P, V)
// (scale may also be a Div) into Attention(Q, Kt, V [, mask]) {scale} in the kiln domain;
// the transposes around it then fold into its "bshd" layout.
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

// Attention reads q, k, v and writes its output in [B, S, H, D] order (layout "bshd") when
// the graph only transposes them from and back to that order: the kernels (CPU and CUDA)
// take the strides and the four Transposes go.
void foldAttentionTransposes(Graph& g) {
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    auto transposeOf = [&](const std::string& value, const std::vector<int64_t>& perm) {
        const int p = index.producer(value);
        if (p < 0 || !index.singleUse(value)) return -1;
        const Node& t = g.nodes[p];
        return t.op_type == "Transpose" && t.domain.empty() && t.attrs.getInts("perm") == perm ? p : -1;
    };
    for (auto& n : g.nodes) {
        if (n.op_type != "Attention" || n.domain != "kiln" || n.inputs.size() < 3 || !n.attrs.getString("layout", "").empty()) continue;
        const int q = transposeOf(n.inputs[0], {0, 2, 1, 3}), k = transposeOf(n.inputs[1], {0, 2, 3, 1}), v = transposeOf(n.inputs[2], {0, 2, 1, 3});
        const int out = index.soleConsumer(n.outputs[0]);
        if (q < 0 || k < 0 || v < 0 || out < 0) continue;
        const Node& back = g.nodes[out];
        if (back.op_type != "Transpose" || !back.domain.empty() || back.attrs.getInts("perm") != std::vector<int64_t>{0, 2, 1, 3}) continue;
        if (!claimNodes(erase, std::vector<int>{q, k, v, out})) continue;
        n.inputs[0] = g.nodes[q].inputs[0], n.inputs[1] = g.nodes[k].inputs[0], n.inputs[2] = g.nodes[v].inputs[0];
        n.outputs[0] = back.outputs[0];
        n.attrs.set("layout", std::string("bshd"));
    }
    eraseNodes(g, erase);
}

void fuseAttentionAndFold(Graph& g, const RouteValues& route) {
    fuseAttention(g, route);
    if (routeOn(route, "fusion.attention")) foldAttentionTransposes(g);
}

}  // namespace

Pass attentionFusionPass() {
    return {"attention_fusion",
            {{"fusion.attention", {"on", "off"}, "on", "attention_fusion", "Fuse MatMul/scale/mask/Softmax/MatMul into one scaled dot-product Attention node"}},
            fuseAttentionAndFold};
}

}  // namespace kiln
