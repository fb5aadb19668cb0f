#include "engine/tactic_selection.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backends/cpu/fast/tactics.h"

namespace kiln {

TimingCache::TimingCache(std::string path) : path_(std::move(path)) {
    std::ifstream in(path_);
    if (!in.good()) return;
    try {
        nlohmann::json j = nlohmann::json::parse(in);
        for (auto& [k, v] : j.at("tactics").items()) entries_[k] = v.get<std::string>();
    } catch (const std::exception&) {
        throw Error("--timing-cache: " + path_ + " is not a Kiln timing cache (delete it to start afresh)");
    }
}

const std::string* TimingCache::find(const std::string& key) const {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    ++hits_;
    return &it->second;
}

void TimingCache::put(const std::string& key, const std::string& tactic) { entries_[key] = tactic; }

void TimingCache::save() const {
    if (path_.empty()) return;
    std::ofstream out(path_, std::ios::trunc);
    check(out.good(), "--timing-cache: cannot write " + path_);
    out << nlohmann::json{{"format", "kiln-timing-cache-1"}, {"tactics", entries_}}.dump(1) << "\n";
}

namespace {

// Inputs for timing a node: constants as they are, other values random with their static
// shape. False when some shape or type is unknown.
bool timingInputs(const Graph& g, const Node& n, std::vector<Tensor>& store, std::string* signature) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    std::ostringstream sig;
    sig << n.op_type;
    for (const auto& [k, v] : n.attrs.all()) sig << "|" << k << "=" << attributeToString(v);
    store.reserve(n.inputs.size());
    for (const auto& in : n.inputs) {
        if (in.empty()) {
            store.emplace_back();
            sig << "|_";
            continue;
        }
        if (auto it = g.initializers.find(in); it != g.initializers.end()) {
            store.push_back(it->second);
            sig << "|const:" << it->second.summary();
            continue;
        }
        const ValueInfo* vi = g.findValueInfo(in);
        if (!vi || vi->dtype != DType::F32 || !vi->shape.fullyKnown()) return false;
        Tensor t(DType::F32, vi->shape.concrete());
        for (auto& v : t.span<float>()) v = d(rng);
        store.push_back(t);
        sig << "|" << t.summary();
    }
    *signature = sig.str();
    return true;
}

double timeKernel(KernelFn fn, const KernelContext& ctx) {
    double best = 1e300;
    fn(ctx);  // warm-up
    for (int i = 0; i < 3; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        fn(ctx);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}

// The model's values at the build's shapes, computed node by node with the chosen tactics,
// so that nodes whose shapes are symbolic in the graph are timed on real tensors. Each
// value is dropped after its last use. Stops (active() false) at the first node it cannot run.
class ValueFlow {
public:
    ValueFlow(const Graph& g, const std::map<std::string, Dims>& input_shapes) : g_(g) {
        if (input_shapes.empty()) return;
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> d(-1, 1);
        for (const auto& vi : g.runtimeInputs()) {
            auto it = input_shapes.find(vi.name);
            if (it == input_shapes.end()) return;
            Tensor t(vi.dtype, it->second);
            if (vi.dtype == DType::F32) {
                for (auto& v : t.span<float>()) v = d(rng);
            } else if (vi.dtype == DType::I64) {
                for (auto& v : t.span<int64_t>()) v = 1;  // ids and masks: a valid index and "attend"
            } else if (vi.dtype == DType::I32) {
                for (auto& v : t.span<int32_t>()) v = 1;
            } else {
                return;  // other input types: no flow, symbolic nodes keep the first tactic
            }
            values_[vi.name] = std::move(t);
        }
        for (size_t i = 0; i < g.nodes.size(); ++i)
            for (const auto& in : g.nodes[i].inputs) last_use_[in] = i;
        for (const auto& o : g.outputs) last_use_[o.name] = g.nodes.size();
        active_ = true;
    }
    bool active() const { return active_; }

    // The node's inputs (nullptr for omitted ones), or false when one is not available.
    bool inputs(const Node& n, std::vector<const Tensor*>& out) const {
        out.clear();
        for (const auto& in : n.inputs) {
            if (in.empty()) {
                out.push_back(nullptr);
            } else if (auto c = g_.initializers.find(in); c != g_.initializers.end()) {
                out.push_back(&c->second);
            } else if (auto v = values_.find(in); v != values_.end()) {
                out.push_back(&v->second);
            } else {
                return false;
            }
        }
        return true;
    }

    // Runs node `index` with `kernel`, keeps its outputs, drops values no later node reads.
    void advance(size_t index, KernelFn kernel) {
        if (!active_) return;
        const Node& n = g_.nodes[index];
        std::vector<const Tensor*> ptrs;
        try {
            if (!inputs(n, ptrs)) throw Error("missing input");
            auto outs = kernel(KernelContext{n, ptrs, g_.opset, nullptr});
            for (size_t i = 0; i < outs.size() && i < n.outputs.size(); ++i)
                if (!n.outputs[i].empty()) values_[n.outputs[i]] = std::move(outs[i]);
        } catch (const Error&) {
            active_ = false, values_.clear();
            return;
        }
        for (const auto& in : n.inputs)
            if (auto it = last_use_.find(in); it != last_use_.end() && it->second == index) values_.erase(in);
    }

private:
    const Graph& g_;
    bool active_ = false;
    std::map<std::string, Tensor> values_;
    std::map<std::string, size_t> last_use_;
};

std::string signatureOf(const Node& n, const std::vector<const Tensor*>& inputs) {
    std::ostringstream sig;
    sig << n.op_type;
    for (const auto& [k, v] : n.attrs.all()) sig << "|" << k << "=" << attributeToString(v);
    for (const Tensor* t : inputs) sig << "|" << (t ? t->summary() : "_");
    return sig.str();
}

}  // namespace

std::map<std::string, std::string> selectTactics(const Graph& g, const RouteValues& route, TimingCache* cache,
                                                 const std::map<std::string, Dims>& input_shapes) {
    std::map<std::string, std::string> chosen;
    ValueFlow flow(g, input_shapes);
    for (size_t index = 0; index < g.nodes.size(); ++index) {
        const Node& n = g.nodes[index];
        std::vector<const Tactic*> candidates;
        for (const auto& t : fastTactics())
            if (std::find(t.ops.begin(), t.ops.end(), n.op_type) != t.ops.end() && t.supports(n, g)) candidates.push_back(&t);
        std::string pick = "reference";
        if (!candidates.empty()) {
            const std::string want = routeValue(route, "tactic.cpu." + candidates.front()->op_class);
            if (want == "reference") {
                pick = "reference";
            } else if (want != "auto") {
                pick = candidates.front()->name;  // a named tactic that does not fit this node: the first that does
                for (const Tactic* t : candidates)
                    if (t->name == want) pick = want;
            } else {
                pick = candidates.front()->name;
                std::vector<Tensor> store;
                std::vector<const Tensor*> ptrs;
                std::string key;
                bool timeable = false;
                if (candidates.size() > 1 && timingInputs(g, n, store, &key)) {
                    for (const auto& t : store) ptrs.push_back(t.defined() ? &t : nullptr);
                    timeable = true;
                } else if (candidates.size() > 1 && flow.active() && flow.inputs(n, ptrs)) {  // symbolic shapes: the flow's tensors
                    key = signatureOf(n, ptrs);
                    timeable = true;
                }
                if (timeable) {
                    for (const Tactic* t : candidates) key += "|" + t->name;
                    if (const std::string* hit = cache ? cache->find(key) : nullptr) {
                        pick = *hit;
                    } else {
                        KernelContext ctx{n, ptrs, g.opset, nullptr};
                        double best = 1e300;
                        for (const Tactic* t : candidates) {
                            try {
                                const double s = timeKernel(t->kernel, ctx);
                                if (s < best) {
                                    best = s;
                                    pick = t->name;
                                }
                            } catch (const Error&) {
                            }
                        }
                        if (cache) cache->put(key, pick);
                    }
                }
            }
        }
        chosen[n.name] = pick;
        flow.advance(index, kernelForTactic(n, pick));
    }
    return chosen;
}

}  // namespace kiln
