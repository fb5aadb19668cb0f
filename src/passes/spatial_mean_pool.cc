// ReduceMean over every spatial axis of an N, C, spatial... tensor is GlobalAveragePool
// (exporters emit it for AdaptiveAvgPool2d(1) and squeeze-excitation blocks). As a pool it
// takes the targets' pooling kernels, which keep channel-blocked layouts on the CPU, instead
// of a generic reduction that forces a layout change around it. keepdims=0 adds a Flatten.
#include <algorithm>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

// The reduced axes of a ReduceMean, normalised to [0, rank); false when not constant.
bool meanAxes(const Graph& g, const Node& n, int64_t rank, std::vector<int64_t>* axes) {
    *axes = n.attrs.getInts("axes");
    if (n.hasInput(1)) {
        const Tensor* t = constantOf(g, n.inputs[1]);
        if (!t) return false;
        *axes = t->toInt64Vector();
    }
    for (int64_t& a : *axes) {
        if (a < -rank || a >= rank) return false;
        if (a < 0) a += rank;
    }
    std::sort(axes->begin(), axes->end());
    return true;
}

void spatialMeanToPool(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.spatial_mean_pool")) return;
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& n = g.nodes[i];
        if (n.op_type != "ReduceMean" || !n.domain.empty() || n.inputs.empty() || n.outputs.size() != 1) continue;
        const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
        if (!vi || !vi->shape.rank_known || vi->shape.dims.size() < 3 || !isFloating(vi->dtype)) continue;
        const int64_t rank = static_cast<int64_t>(vi->shape.dims.size());
        std::vector<int64_t> axes;
        if (!meanAxes(g, n, rank, &axes) || axes.size() != static_cast<size_t>(rank - 2)) continue;
        bool spatial = true;
        for (size_t k = 0; k < axes.size(); ++k) spatial &= axes[k] == static_cast<int64_t>(k) + 2;
        if (!spatial) continue;
        const bool keep = n.attrs.getInt("keepdims", 1) != 0;
        Node pool{n.name, "GlobalAveragePool", "", {n.inputs[0]}, {n.outputs[0]}, {}};
        if (!keep) {
            pool.outputs[0] = freshName(g, n.outputs[0] + "_pooled");
            Node flat{n.name + "_flatten", "Flatten", "", {pool.outputs[0]}, {n.outputs[0]}, {}};
            flat.attrs.set("axis", int64_t{1});
            added.push_back(pool);
            added.push_back(flat);
            g.value_info[pool.outputs[0]] = ValueInfo{pool.outputs[0], vi->dtype, Shape::unknown()};
        } else {
            added.push_back(pool);
        }
        erase[i] = true;
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass spatialMeanPoolPass() {
    return {"spatial_mean_pool",
            {{"fusion.spatial_mean_pool", {"on", "off"}, "on", "spatial_mean_pool", "Run ReduceMean over all spatial axes as GlobalAveragePool"}},
            spatialMeanToPool};
}

}  // namespace kiln
