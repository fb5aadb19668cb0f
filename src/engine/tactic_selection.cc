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

}  // namespace

std::map<std::string, std::string> selectTactics(const Graph& g, const RouteValues& route, TimingCache* cache) {
    std::map<std::string, std::string> chosen;
    for (const auto& n : g.nodes) {
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
                std::string key;
                if (candidates.size() > 1 && timingInputs(g, n, store, &key)) {
                    for (const Tactic* t : candidates) key += "|" + t->name;
                    if (const std::string* hit = cache ? cache->find(key) : nullptr) {
                        pick = *hit;
                    } else {
                        std::vector<const Tensor*> ptrs;
                        for (const auto& t : store) ptrs.push_back(t.defined() ? &t : nullptr);
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
    }
    return chosen;
}

}  // namespace kiln
