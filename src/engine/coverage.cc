#include "engine/coverage.h"

#include <algorithm>
#include <map>
#include <set>

#include "backends/cpu/fast/tactics.h"
#include "engine/builder.h"
#include "route/build_route.h"

namespace kiln {

namespace {

// Ops whose reference kernel only relabels or forwards data (or makes a tiny shape value):
// a fast kernel would gain nothing.
bool shapeOrView(const std::string& op) {
    static const std::set<std::string> ops = {"Shape", "Size", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Constant",
                                              "ConstantOfShape", "Dropout", "Range"};
    return ops.count(op) > 0;
}

// Slow nodes of `g` and of its subgraphs, named (and their tactics looked up) under `prefix`.
// A control-flow node itself only dispatches: its subgraphs' nodes are what is reported.
void collectSlow(const Engine& engine, const Graph& g, const std::string& prefix, const RouteValues& route, std::vector<SlowNode>& slow) {
    for (const Node& n : g.nodes) {
        const auto subgraphs = subgraphAttributes(n);
        for (const auto& attr : subgraphs) collectSlow(engine, *n.attrs.getGraph(attr), prefix + subgraphPrefix(n, attr), route, slow);
        auto t = engine.tactics.find(prefix + n.name);
        if ((t != engine.tactics.end() && t->second != "reference") || shapeOrView(n.op_type) || !subgraphs.empty()) continue;
        std::string why;
        for (const Tactic& tac : fastTactics()) {
            if (std::find(tac.ops.begin(), tac.ops.end(), n.op_type) == tac.ops.end()) continue;
            const std::string& want = routeValue(route, "tactic.cpu." + tac.op_class);
            why = want == "reference" ? "the route sets tactic.cpu." + tac.op_class + "=reference"
                                      : "no fast " + tac.op_class + " tactic supports this node's attributes or types";
            break;
        }
        if (why.empty()) why = "no fast kernel for " + n.op_type;
        slow.push_back({prefix + n.name, n.op_type, why});
    }
}

size_t nodeCount(const Graph& g) {
    size_t count = g.nodes.size();
    for (const Node& n : g.nodes)
        for (const auto& attr : subgraphAttributes(n)) count += nodeCount(*n.attrs.getGraph(attr));
    return count;
}

}  // namespace

std::vector<SlowNode> referenceKernelNodes(const Engine& engine) {
    std::vector<SlowNode> slow;
    if (targetKind(engine.target) != "cpu") return slow;
    collectSlow(engine, engine.graph, "", BuildRoute::parse(engine.route, Builder::space()).values(), slow);
    return slow;
}

std::string coverageSummary(const Engine& engine, const std::vector<SlowNode>& slow) {
    if (slow.empty()) return "";
    std::map<std::string, int> by_op;
    for (const auto& s : slow) ++by_op[s.op];
    std::vector<std::pair<int, std::string>> order;
    for (const auto& [op, k] : by_op) order.push_back({-k, op});
    std::sort(order.begin(), order.end());
    std::string text = std::to_string(slow.size()) + " of " + std::to_string(nodeCount(engine.graph)) + " nodes on reference kernels (";
    for (size_t i = 0; i < order.size(); ++i) text += (i ? ", " : "") + order[i].second + " x" + std::to_string(-order[i].first);
    return text + ")";
}

}  // namespace kiln
