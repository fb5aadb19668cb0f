#include "backends/cpu/tactic_selection.h"

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backends/cpu/fast/tactics.h"
#include "ir/file_write.h"

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
    writeFileAtomically(path_, nlohmann::json{{"format", "kiln-timing-cache-1"}, {"tactics", entries_}}.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

namespace {

// Whether every non-constant input of `n` has a known f32 type and static shape.
bool staticShapes(const Graph& g, const Node& n) {
    for (const auto& in : n.inputs) {
        if (in.empty() || g.initializers.count(in)) continue;
        const ValueInfo* vi = g.findValueInfo(in);
        if (!vi || vi->dtype != DType::F32 || !vi->shape.fullyKnown()) return false;
    }
    return true;
}

// Inputs for timing a node with static shapes: constants as they are, other values random.
std::vector<Tensor> staticTimingInputs(const Graph& g, const Node& n) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<Tensor> store;
    for (const auto& in : n.inputs) {
        if (in.empty()) {
            store.emplace_back();
        } else if (auto it = g.initializers.find(in); it != g.initializers.end()) {
            store.push_back(it->second);
        } else {
            Tensor t(DType::F32, g.findValueInfo(in)->shape.concrete());
            for (auto& v : t.span<float>()) v = d(rng);
            store.push_back(t);
        }
    }
    return store;
}

// The timing-cache key of a node's timing inputs (constants marked as such).
std::string signatureOf(const Graph& g, const Node& n, const std::vector<const Tensor*>& inputs) {
    std::ostringstream sig;
    sig << n.op_type;
    for (const auto& [k, v] : n.attrs.all()) sig << "|" << k << "=" << attributeToString(v);
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i]) sig << "|_";
        else sig << "|" << (g.initializers.count(n.inputs[i]) ? "const:" : "") << inputs[i]->summary();
    }
    return sig.str();
}

// The fastest of the candidates on these inputs (`fallback` when none runs). Each tactic
// runs once to warm up, then the candidates take turns, round after round, until every one
// has run at least kMinRuns times and kMinSeconds in all (or kMaxRuns times): interleaving
// spreads a noisy machine's slow phases over all of them, and each keeps its fastest run.
std::string fastestTactic(const std::vector<const Tactic*>& cands, const KernelContext& ctx, const std::string& fallback) {
    constexpr int kMinRuns = 5, kMaxRuns = 50;
    constexpr double kMinSeconds = 0.01;
    struct Timing {
        const Tactic* tactic;
        double best = 1e300, total = 0;
    };
    std::vector<Timing> timings;
    for (const Tactic* t : cands) {
        try {
            t->kernel(ctx);
            timings.push_back({t});
        } catch (const Error&) {
        }
    }
    for (int run = 0; run < kMaxRuns; ++run) {
        bool enough = run >= kMinRuns;
        for (auto& tm : timings) {
            const auto t0 = std::chrono::steady_clock::now();
            tm.tactic->kernel(ctx);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            tm.best = std::min(tm.best, s), tm.total += s;
            enough = enough && tm.total >= kMinSeconds;
        }
        if (enough) break;
    }
    std::string pick = fallback;
    double best = 1e300;
    for (const auto& tm : timings)
        if (tm.best < best) best = tm.best, pick = tm.tactic->name;
    return pick;
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

}  // namespace

std::map<std::string, std::string> selectTactics(const Graph& g, const RouteValues& route, TimingCache* cache,
                                                 const std::map<std::string, Dims>& input_shapes) {
    // Candidates per node, and each node's route value for its op class.
    std::vector<std::vector<const Tactic*>> candidates(g.nodes.size());
    std::vector<std::string> wants(g.nodes.size());
    bool symbolic = false;  // some node to time has symbolic shapes: only then run the model
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        for (const auto& t : fastTactics())
            if (std::find(t.ops.begin(), t.ops.end(), g.nodes[i].op_type) != t.ops.end() && t.supports(g.nodes[i], g)) candidates[i].push_back(&t);
        if (candidates[i].empty()) continue;
        wants[i] = routeValue(route, "tactic.cpu." + candidates[i].front()->op_class);
        symbolic |= wants[i] == "auto" && candidates[i].size() > 1 && !staticShapes(g, g.nodes[i]);
    }
    ValueFlow flow(g, symbolic ? input_shapes : std::map<std::string, Dims>{});
    std::map<std::string, std::string> chosen;
    for (size_t index = 0; index < g.nodes.size(); ++index) {
        const Node& n = g.nodes[index];
        const auto& cands = candidates[index];
        const std::string& want = wants[index];
        std::string pick = cands.empty() || want == "reference" ? "reference" : cands.front()->name;
        if (!cands.empty() && want != "auto" && want != "reference") {
            for (const Tactic* t : cands)  // a named tactic that does not fit this node keeps the first that does
                if (t->name == want) pick = want;
        } else if (want == "auto" && cands.size() > 1) {
            std::vector<Tensor> store;
            std::vector<const Tensor*> ptrs;
            bool timeable = false;
            if (staticShapes(g, n)) {
                store = staticTimingInputs(g, n);
                for (const auto& t : store) ptrs.push_back(t.defined() ? &t : nullptr);
                timeable = true;
            } else {
                timeable = flow.active() && flow.inputs(n, ptrs);  // symbolic shapes: the flow's tensors
            }
            if (timeable) {
                std::string key = signatureOf(g, n, ptrs);
                for (const Tactic* t : cands) key += "|" + t->name;
                if (const std::string* hit = cache ? cache->find(key) : nullptr) {
                    pick = *hit;
                } else {
                    pick = fastestTactic(cands, KernelContext{n, ptrs, g.opset, nullptr}, pick);
                    if (cache) cache->put(key, pick);
                }
            }
        }
        chosen[n.name] = pick;
        flow.advance(index, kernelForTactic(n, pick));
        // Subgraphs: their nodes' tactics under the subgraph's prefix. Their shapes are
        // timed where static; the value flow does not enter them.
        for (const auto& attr : subgraphAttributes(n))
            for (auto& [inner, tactic] : selectTactics(*n.attrs.getGraph(attr), route, cache, {})) chosen[subgraphPrefix(n, attr) + inner] = std::move(tactic);
    }
    return chosen;
}

}  // namespace kiln
