#include "backends/cpu/graph_executor.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "backends/cpu/fast/tactics.h"

namespace kiln {

void checkInputs(const Graph& g, const TensorMap& inputs) {
    std::map<std::string, int64_t> symbols;
    const auto declared = g.runtimeInputs();
    for (const auto& vi : declared) {
        auto it = inputs.find(vi.name);
        check(it != inputs.end(), [&] { return "missing input '" + vi.name + "' (" + std::string(dtypeName(vi.dtype)) + vi.shape.toString() + ")"; });
        const Tensor& t = it->second;
        check(vi.dtype == DType::Undefined || t.dtype() == vi.dtype, [&] {
            return "input '" + vi.name + "' has element type " + std::string(dtypeName(t.dtype())) + ", the model expects " + std::string(dtypeName(vi.dtype));
        });
        if (!vi.shape.rank_known) continue;
        auto wrong_shape = [&] { return "input '" + vi.name + "' has shape " + dimsToString(t.dims()) + ", the model expects " + vi.shape.toString(); };
        check(t.rank() == vi.shape.dims.size(), wrong_shape);
        for (size_t d = 0; d < t.rank(); ++d) {
            const Dim& dim = vi.shape.dims[d];
            if (dim.known()) {
                check(t.dims()[d] == dim.size, wrong_shape);
            } else if (!dim.symbol.empty()) {
                auto [s, fresh] = symbols.emplace(dim.symbol, t.dims()[d]);
                check(fresh || s->second == t.dims()[d], [&] {
                    return "input '" + vi.name + "' dim '" + dim.symbol + "' is " + std::to_string(t.dims()[d]) + " but another input set it to " +
                           std::to_string(s->second);
                });
            }
        }
    }
    for (const auto& [name, t] : inputs) {
        bool known = false;
        for (const auto& vi : declared) known |= vi.name == name;
        check(known, [&] { return "unknown input '" + name + "' (the model's inputs are: " + [&] {
            std::string s;
            for (const auto& vi : declared) s += (s.empty() ? "" : ", ") + vi.name;
            return s;
        }() + ")"; });
    }
}

GraphExecutor::Profile::~Profile() {
    if (ms.empty()) return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& [op, t] : ms) {
        rows.emplace_back(t, op);
        total += t;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "kiln profile (KILN_PROFILE): time per op type over all runs\n");
    for (const auto& [t, op] : rows) std::fprintf(stderr, "  %-28s %10.2f ms  %5.1f%%\n", op.c_str(), t, 100 * t / std::max(total, 1e-9));
}

GraphExecutor::GraphExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics) : graph_(graph) {
    if (const char* p = std::getenv("KILN_PROFILE")) {
        profile_ = std::make_shared<Profile>();
        profile_by_node_ = std::string(p) == "nodes";
    }
    std::set<std::string> missing;
    subgraphs_.resize(graph.nodes.size());
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
        const Node& n = graph.nodes[i];
        auto t = tactics.find(n.name);
        kernels_.push_back(t == tactics.end() ? referenceKernels().find(n.op_type) : kernelForTactic(n, t->second));
        memos_.push_back(std::make_unique<KernelMemo>());
        if (!kernels_.back()) missing.insert(n.op_type);
        for (const auto& in : n.inputs) last_use_[in] = i;
        for (const auto& attr : subgraphAttributes(n)) {
            const std::string prefix = subgraphPrefix(n, attr);
            std::map<std::string, std::string> inner;
            for (auto it = tactics.lower_bound(prefix); it != tactics.end() && it->first.starts_with(prefix); ++it) inner[it->first.substr(prefix.size())] = it->second;
            Subgraph sub{n.attrs.getGraph(attr), nullptr};
            try {
                sub.executor = std::make_unique<GraphExecutor>(*sub.graph, inner);
            } catch (const Error& e) {
                throw Error(n.describe() + " " + attr + ": " + e.what());
            }
            sub.executor->shareProfile(profile_, profile_by_node_);
            subgraphs_[i].push_back(std::move(sub));
        }
    }
    // What each node frees: inputs no later node reads, other than graph outputs and constants.
    std::set<std::string> outputs;
    for (const auto& o : graph.outputs) outputs.insert(o.name);
    frees_.resize(graph.nodes.size());
    for (const auto& [value, i] : last_use_)
        if (!value.empty() && !outputs.count(value) && !graph.initializers.count(value)) frees_[i].push_back(value);
    if (!missing.empty()) {
        std::string list;
        for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
        throw Error("no CPU kernel for: " + list);
    }
}

void GraphExecutor::shareProfile(const std::shared_ptr<Profile>& profile, bool by_node) {
    profile_ = profile, profile_by_node_ = by_node;
    for (auto& subs : subgraphs_)
        for (auto& sub : subs) sub.executor->shareProfile(profile, by_node);
}

size_t GraphExecutor::lastUse(const std::string& value) const {
    for (const auto& o : graph_.outputs)
        if (o.name == value) return graph_.nodes.size();
    auto it = last_use_.find(value);
    return it == last_use_.end() ? 0 : it->second;
}

const GraphExecutor& GraphExecutor::subgraph(size_t node_index, const Graph& g) const {
    for (const auto& sub : subgraphs_[node_index])
        if (sub.graph.get() == &g) return *sub.executor;
    throw Error(graph_.nodes[node_index].describe() + ": subgraph '" + g.name + "' is not one of the node's");
}

std::vector<Tensor> GraphExecutor::run(const TensorMap& inputs, ValuePlacer* placer) const {
    checkInputs(graph_, inputs);
    return execute(inputs, placer);
}

std::vector<Tensor> GraphExecutor::execute(TensorMap values, ValuePlacer* placer) const {
    // Computed values and the inputs; constants are read from the graph where they are
    // (copying them in cost a map node per constant per run).
    auto find = [&](const std::string& name) -> const Tensor* {
        if (auto it = values.find(name); it != values.end()) return &it->second;
        if (auto it = graph_.initializers.find(name); it != graph_.initializers.end()) return &it->second;
        return nullptr;
    };
    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
        const Node& node = graph_.nodes[i];
        KernelContext ctx{node, {}, graph_.opset, nullptr, placer, memos_[i].get()};
        if (!subgraphs_[i].empty())
            ctx.run_subgraph = [this, i](const Graph& g, const TensorMap& scope) { return subgraph(i, g).execute(scope, nullptr); };
        for (const auto& in : node.inputs) {
            if (in.empty()) {
                ctx.inputs.push_back(nullptr);
                continue;
            }
            const Tensor* value = find(in);
            check(value != nullptr, [&] { return node.describe() + ": input '" + in + "' has no value"; });
            ctx.inputs.push_back(value);
        }
        const bool timed = profile_ && subgraphs_[i].empty();  // a control-flow node's time is its subgraphs'
        const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        std::vector<Tensor> outs;
        try {
            outs = kernels_[i](ctx);
        } catch (const Error& e) {
            const std::string where = node.describe();
            if (std::string_view(e.what()).starts_with(where)) throw;
            throw Error(where + ": " + e.what());  // a size check in a shared helper names no node
        } catch (const std::bad_alloc&) {
            throw Error(node.describe() + ": out of memory");
        } catch (const std::length_error&) {
            throw Error(node.describe() + ": a tensor would be too large (bad shape values?)");
        } catch (const std::out_of_range& e) {
            throw Error(node.describe() + ": index out of range (" + e.what() + ")");
        }
        if (timed) {
            std::lock_guard<std::mutex> lock(profile_->mutex);
            profile_->ms[profile_by_node_ ? node.name : node.op_type] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        }
        for (size_t k = 0; k < node.outputs.size(); ++k) {
            if (node.outputs[k].empty()) continue;
            check(k < outs.size(), [&] { return node.describe() + ": kernel produced no value for output '" + node.outputs[k] + "'"; });
            values[node.outputs[k]] = placer ? placer->place(i, node.outputs[k], std::move(outs[k])) : std::move(outs[k]);
        }
        for (const auto& value : frees_[i]) values.erase(value);
    }
    std::vector<Tensor> result;
    for (const auto& o : graph_.outputs) {
        const Tensor* value = find(o.name);
        check(value != nullptr, [&] { return "graph output '" + o.name + "' was not computed"; });
        result.push_back(*value);
    }
    return result;
}

}  // namespace kiln
