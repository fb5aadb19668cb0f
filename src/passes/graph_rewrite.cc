#include "passes/graph_rewrite.h"

#include <limits>
#include <set>

namespace kiln {

GraphIndex::GraphIndex(const Graph& g) {
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        for (const auto& o : g.nodes[i].outputs)
            if (!o.empty()) producer_[o] = static_cast<int>(i);
        for (const auto& in : g.nodes[i].inputs)
            if (!in.empty()) consumers_[in].push_back(static_cast<int>(i));
    }
    for (const auto& o : g.outputs) outputs_[o.name] = true;
}

int GraphIndex::producer(const std::string& value) const {
    auto it = producer_.find(value);
    return it == producer_.end() ? -1 : it->second;
}

const std::vector<int>& GraphIndex::consumers(const std::string& value) const {
    static const std::vector<int> none;
    auto it = consumers_.find(value);
    return it == consumers_.end() ? none : it->second;
}

const Tensor* constantOf(const Graph& g, const std::string& value) {
    auto it = g.initializers.find(value);
    if (it == g.initializers.end()) return nullptr;
    // A graph input with an initializer may be overridden by the user: not a constant.
    for (const auto& in : g.inputs)
        if (in.name == value) return nullptr;
    return &it->second;
}

bool scalarConstant(const Graph& g, const std::string& value, double* out) {
    const Tensor* t = constantOf(g, value);
    if (!t || t->numel() != 1 || !isFloating(t->dtype())) return false;
    *out = t->scalarAt(0);
    return true;
}

std::string freshName(const Graph& g, const std::string& base) {
    std::set<std::string> used = definedNames(g);
    for (const auto& n : g.nodes) used.insert(n.name);
    for (const auto& [name, vi] : g.value_info) used.insert(name);
    if (!used.count(base)) return base;
    for (int i = 1;; ++i) {
        std::string name = base + "_" + std::to_string(i);
        if (!used.count(name)) return name;
    }
}

void eraseNodes(Graph& g, const std::vector<bool>& erase) {
    std::vector<Node> kept;
    for (size_t i = 0; i < g.nodes.size(); ++i)
        if (i >= erase.size() || !erase[i]) kept.push_back(std::move(g.nodes[i]));
    g.nodes = std::move(kept);
}

void replaceNodes(Graph& g, const std::vector<bool>& erase, std::vector<Node>& added) {
    eraseNodes(g, erase);
    for (auto& n : added) g.nodes.push_back(std::move(n));
    added.clear();
}

void replaceUses(Graph& g, const std::string& from, const std::string& to) {
    for (auto& n : g.nodes)
        for (auto& in : n.inputs)
            if (in == from) in = to;
}

std::string otherInput(const Node& n, const std::string& known) {
    if (n.inputs.size() != 2) return "";
    if (n.inputs[0] == known) return n.inputs[1];
    if (n.inputs[1] == known) return n.inputs[0];
    return "";
}

bool reducesLastAxis(const Graph& g, const Node& n, const std::string& op) {
    if (n.op_type != op || n.attrs.getInt("keepdims", 1) != 1) return false;
    std::vector<int64_t> axes = n.attrs.getInts("axes");
    if (n.hasInput(1)) {
        const Tensor* t = constantOf(g, n.inputs[1]);
        if (!t) return false;
        axes = t->toInt64Vector();
    }
    if (axes.size() != 1) return false;
    if (axes[0] == -1) return true;
    const ValueInfo* vi = n.inputs.empty() ? nullptr : g.findValueInfo(n.inputs[0]);
    return vi && vi->shape.rank_known && axes[0] == static_cast<int64_t>(vi->shape.dims.size()) - 1;
}

bool fusableActivation(const Graph& g, const Node& n, std::string* name, std::vector<float>* params) {
    static const std::set<std::string> plain = {"Relu", "Sigmoid", "Tanh", "HardSwish", "Gelu", "Softplus"};
    if (!n.domain.empty() || n.outputs.size() != 1) return false;
    params->clear();
    *name = n.op_type;
    if (plain.count(n.op_type)) {
        if (n.op_type == "Gelu" && n.attrs.getString("approximate", "none") == "tanh") *name = "GeluTanh";
        return true;
    }
    if (n.op_type == "LeakyRelu") {
        params->push_back(n.attrs.getFloat("alpha", 0.01f));
        return true;
    }
    if (n.op_type == "HardSigmoid") {
        *params = {n.attrs.getFloat("alpha", 0.2f), n.attrs.getFloat("beta", 0.5f)};
        return true;
    }
    if (n.op_type == "Clip") {
        float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
        if (g.opset < 11) {
            lo = n.attrs.getFloat("min", lo);
            hi = n.attrs.getFloat("max", hi);
        } else {
            double v;
            if (n.hasInput(1)) {
                if (!scalarConstant(g, n.inputs[1], &v)) return false;
                lo = static_cast<float>(v);
            }
            if (n.hasInput(2)) {
                if (!scalarConstant(g, n.inputs[2], &v)) return false;
                hi = static_cast<float>(v);
            }
        }
        *params = {lo, hi};
        return true;
    }
    return false;
}

bool siluOf(const Graph& g, const GraphIndex& index, const std::string& value, int* sigmoid, int* mul) {
    const auto& users = index.consumers(value);
    if (users.size() != 2 || index.isGraphOutput(value)) return false;
    for (int k = 0; k < 2; ++k) {
        const Node& s = g.nodes[users[k]];
        const Node& m = g.nodes[users[1 - k]];
        if (s.op_type != "Sigmoid" || !s.domain.empty() || s.outputs.size() != 1 || index.soleConsumer(s.outputs[0]) != users[1 - k]) continue;
        if (m.op_type != "Mul" || !m.domain.empty() || m.inputs.size() != 2 || otherInput(m, value) != s.outputs[0]) continue;
        *sigmoid = users[k];
        *mul = users[1 - k];
        return true;
    }
    return false;
}

void setActivation(Node& fused, const std::string& name, const std::vector<float>& params) {
    fused.attrs.set("activation", name);
    fused.attrs.set("activation_params", params);
}

}  // namespace kiln
