// Convolution data layout: with layout.conv=nhwc (or auto on a GPU target), 2-D Conv/FusedConv
// nodes run on channels-last data: the activation is transposed to NHWC before and back to
// NCHW after the conv (the node gets data_layout="NHWC"); adjacent transposes cancel afterwards.
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void assignConvLayout(Graph& g, const RouteValues& route) {
    const std::string& layout = routeValue(route, "layout.conv");
    if (layout != "nhwc" && !(layout == "auto" && passTarget(route) == "cuda")) return;
    std::vector<Node> added;
    for (auto& n : g.nodes) {
        if (n.op_type != "Conv" && n.op_type != "FusedConv") continue;
        if (n.attrs.getString("data_layout", "NCHW") != "NCHW") continue;
        const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
        if (!vi || !vi->shape.rank_known || vi->shape.dims.size() != 4) continue;
        auto to_nhwc = [&](const std::string& v) {
            std::string name = freshName(g, v + "_nhwc");
            Node t{freshName(g, name + "_transpose"), "Transpose", "", {v}, {name}, {}};
            t.attrs.set("perm", std::vector<int64_t>{0, 2, 3, 1});
            added.push_back(t);
            g.value_info[name] = ValueInfo{name, DType::Undefined, {}};
            return name;
        };
        n.inputs[0] = to_nhwc(n.inputs[0]);
        if (n.inputs.size() > 3 && !n.inputs[3].empty()) n.inputs[3] = to_nhwc(n.inputs[3]);  // residual
        const std::string result = n.outputs[0];
        n.outputs[0] = freshName(g, result + "_nhwc");
        g.value_info[n.outputs[0]] = ValueInfo{n.outputs[0], DType::Undefined, {}};
        n.attrs.set("data_layout", std::string("NHWC"));
        n.op_type = "FusedConv";  // the kiln-domain conv carries the layout attribute
        n.domain = "kiln";
        Node back{freshName(g, result + "_to_nchw"), "Transpose", "", {n.outputs[0]}, {result}, {}};
        back.attrs.set("perm", std::vector<int64_t>{0, 3, 1, 2});
        added.push_back(back);
    }
    for (auto& n : added) g.nodes.push_back(std::move(n));
    // value_info placeholders only reserved names; drop them so types stay inferred at run time.
    for (auto it = g.value_info.begin(); it != g.value_info.end();)
        it = it->second.dtype == DType::Undefined ? g.value_info.erase(it) : std::next(it);
}

}  // namespace

Pass layoutAssignmentPass() {
    return {"layout_assignment",
            {{"layout.conv", {"nchw", "nhwc", "auto"}, "nchw", "layout_assignment",
              "Data layout of 2-D convolutions: channels-first, channels-last, or auto (nhwc on GPU targets, nchw on the CPU)"}},
            assignConvLayout};
}

}  // namespace kiln
