// Clean-up passes: dead code elimination, common subexpression elimination, identity
// elimination, reshape chains and transpose cancellation.
#include <set>
#include <sstream>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void eliminateDeadCode(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "opt.dce")) return;
    std::set<std::string> live;
    for (const auto& o : g.outputs) live.insert(o.name);
    std::vector<bool> erase(g.nodes.size(), true);
    for (size_t k = g.nodes.size(); k-- > 0;) {
        const Node& n = g.nodes[k];
        bool used = false;
        for (const auto& o : n.outputs) used |= live.count(o) != 0;
        if (!used) continue;
        erase[k] = false;
        for (const auto& in : n.inputs) live.insert(in);
    }
    eraseNodes(g, erase);
    for (auto it = g.initializers.begin(); it != g.initializers.end();) {
        bool is_input = false;
        for (const auto& in : g.inputs) is_input |= in.name == it->first;
        it = (!live.count(it->first) && !is_input) ? g.initializers.erase(it) : std::next(it);
    }
}

std::string nodeKey(const Node& n) {
    std::ostringstream s;
    s << n.domain << "|" << n.op_type << "|" << n.outputs.size();
    for (const auto& in : n.inputs) s << "|" << in;
    for (const auto& [k, v] : n.attrs.all()) {
        if (std::holds_alternative<std::shared_ptr<Graph>>(v)) return "";  // subgraphs: never merged
        s << "|" << k << "=" << attributeToString(v);
        if (const auto* t = std::get_if<Tensor>(&v)) s << "@" << static_cast<const void*>(t->raw());
    }
    return s.str();
}

void eliminateCommonSubexpressions(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "opt.cse")) return;
    topologicalSort(g);
    std::map<std::string, size_t> seen;
    std::set<std::string> graph_outputs;
    for (const auto& o : g.outputs) graph_outputs.insert(o.name);
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        std::string key = nodeKey(n);
        if (key.empty() || n.op_type.rfind("Random", 0) == 0) continue;
        auto [it, fresh] = seen.emplace(key, i);
        if (fresh) continue;
        bool exposes = false;
        for (const auto& o : n.outputs) exposes |= graph_outputs.count(o) != 0;
        if (exposes) continue;
        const Node& keep = g.nodes[it->second];
        for (size_t k = 0; k < n.outputs.size(); ++k) replaceUses(g, n.outputs[k], keep.outputs[k]);
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

void eliminateIdentities(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "opt.identity_elim")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        bool identity = n.op_type == "Identity" || (n.op_type == "Dropout" && (n.outputs.size() < 2 || n.outputs[1].empty() || index.consumers(n.outputs[1]).empty()));
        if (n.op_type == "Cast" && n.hasInput(0)) {  // a Cast to the type the value already has
            const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
            const Tensor* c = constantOf(g, n.inputs[0]);
            const DType from = c ? c->dtype() : (vi ? vi->dtype : DType::Undefined);
            identity = from != DType::Undefined && n.attrs.getString("to", "") == dtypeName(from);
        }
        if (!identity || !n.domain.empty() || !n.hasInput(0) || index.isGraphOutput(n.outputs[0])) continue;
        if (n.op_type == "Dropout" && n.outputs.size() > 1 && index.isGraphOutput(n.outputs[1])) continue;
        replaceUses(g, n.outputs[0], n.inputs[0]);
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

void foldReshapeChains(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "opt.reshape_chain")) return;
    GraphIndex index(g);
    for (auto& n : g.nodes) {
        if (n.op_type != "Reshape" || g.opset < 5 || n.inputs.size() < 2) continue;
        const Tensor* shape = constantOf(g, n.inputs[1]);
        if (!shape || n.attrs.getInt("allowzero", 0) != 0) continue;
        bool copies_dims = false;
        for (int64_t d : shape->toInt64Vector()) copies_dims |= d == 0;
        int p = index.producer(n.inputs[0]);
        if (copies_dims || p < 0) continue;
        const Node& prev = g.nodes[p];
        if (prev.op_type == "Reshape" || prev.op_type == "Flatten" || prev.op_type == "Squeeze" || prev.op_type == "Unsqueeze")
            n.inputs[0] = prev.inputs[0];  // the earlier node becomes dead if unused elsewhere
    }
}

void cancelTransposes(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "opt.transpose_cancel")) return;
    GraphIndex index(g);
    for (auto& n : g.nodes) {
        if (n.op_type != "Transpose") continue;
        int p = index.producer(n.inputs[0]);
        if (p < 0 || g.nodes[p].op_type != "Transpose") continue;
        const Node& prev = g.nodes[p];
        auto p1 = prev.attrs.getInts("perm"), p2 = n.attrs.getInts("perm");
        if (p1.empty() || p2.empty() || p1.size() != p2.size()) continue;
        std::vector<int64_t> combined(p2.size());
        bool identity = true;
        for (size_t i = 0; i < p2.size(); ++i) {
            combined[i] = p1[p2[i]];
            identity &= combined[i] == static_cast<int64_t>(i);
        }
        n.inputs[0] = prev.inputs[0];
        if (identity) {
            n.op_type = "Identity";
            n.attrs = {};
        } else {
            n.attrs.set("perm", combined);
        }
    }
}

}  // namespace

Pass deadCodeEliminationPass() {
    return {"dead_code_elimination", {{"opt.dce", {"on", "off"}, "on", "dead_code_elimination", "Remove nodes and initializers no output depends on"}}, eliminateDeadCode};
}
Pass commonSubexpressionPass() {
    return {"common_subexpression", {{"opt.cse", {"on", "off"}, "on", "common_subexpression", "Merge nodes that compute the same thing from the same inputs"}}, eliminateCommonSubexpressions};
}
Pass identityEliminationPass() {
    return {"identity_elimination", {{"opt.identity_elim", {"on", "off"}, "on", "identity_elimination", "Remove Identity, inference-time Dropout and Casts to the same type"}}, eliminateIdentities};
}
Pass reshapeChainPass() {
    return {"reshape_chain", {{"opt.reshape_chain", {"on", "off"}, "on", "reshape_chain", "Collapse Reshape/Flatten/Squeeze/Unsqueeze followed by Reshape into one Reshape"}}, foldReshapeChains};
}
Pass transposeCancelPass() {
    return {"transpose_cancel", {{"opt.transpose_cancel", {"on", "off"}, "on", "transpose_cancel", "Merge consecutive Transposes and drop identity permutations"}}, cancelTransposes};
}

}  // namespace kiln
