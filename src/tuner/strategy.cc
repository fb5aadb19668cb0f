#include "tuner/strategy.h"

#include <algorithm>

#include "ir/error.h"

namespace kiln {

namespace {
bool faster(const CandidateResult* r, double than) { return r && r->outcome == Outcome::Ok && (than <= 0 || r->median_ms < than); }
}  // namespace

Domain domainOf(const std::vector<BuildRoute>& routes, const ParameterSpace& space) {
    Domain d;
    for (const auto& p : space.parameters()) {
        std::vector<std::string> values;
        for (const auto& r : routes) {
            const std::string& v = r.get(p.name);
            if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
        }
        if (values.size() > 1) d.emplace_back(p.name, values);
    }
    return d;
}

Strategy parseStrategy(const std::string& name) {
    if (name == "exhaustive") return Strategy::Exhaustive;
    if (name == "greedy") return Strategy::Greedy;
    if (name == "mixed") return Strategy::Mixed;
    throw Error("--strategy: unknown strategy '" + name + "' (exhaustive, greedy, mixed; random:N and one-at-a-time are expression terms)");
}

std::string strategyName(Strategy s) { return s == Strategy::Exhaustive ? "exhaustive" : (s == Strategy::Greedy ? "greedy" : "mixed"); }

void searchExhaustive(const std::vector<BuildRoute>& routes, const Evaluator& evaluate) {
    constexpr size_t kChunk = 16;
    for (size_t start = 0; start < routes.size(); start += kChunk) {
        const size_t end = std::min(routes.size(), start + kChunk);
        evaluate.prefetch(std::vector<BuildRoute>(routes.begin() + static_cast<long>(start), routes.begin() + static_cast<long>(end)));
        for (size_t i = start; i < end; ++i)
            if (!evaluate.evaluate(routes[i])) return;
    }
}

namespace {
// The routes that change `name` of `base` to each of its other values.
std::vector<BuildRoute> variations(const BuildRoute& base, const std::string& name, const std::vector<std::string>& values, const ParameterSpace& space) {
    std::vector<BuildRoute> out;
    for (const auto& v : values)
        if (v != base.get(name)) {
            BuildRoute trial = base;
            trial.set(name, v, space);
            out.push_back(trial);
        }
    return out;
}
}  // namespace

std::vector<BuildRoute> oneAtATimeRoutes(const Domain& domain, const ParameterSpace& space) {
    const BuildRoute def = BuildRoute::defaults(space);
    std::vector<BuildRoute> out = {def};
    for (const auto& [name, values] : domain)
        for (auto& r : variations(def, name, values, space)) out.push_back(std::move(r));
    return out;
}

void searchGreedy(const Domain& domain, const ParameterSpace& space, const Evaluator& evaluate) {
    BuildRoute current = BuildRoute::defaults(space);
    const CandidateResult* base = evaluate.evaluate(current);
    if (!base) return;
    double best = base->outcome == Outcome::Ok ? base->median_ms : 0;
    for (int pass = 0; pass < 2; ++pass)
        for (const auto& [name, values] : domain) {
            const auto trials = variations(current, name, values, space);  // all from the same base
            evaluate.prefetch(trials);
            for (const auto& trial : trials) {
                const CandidateResult* r = evaluate.evaluate(trial);
                if (!r) return;
                if (faster(r, best)) {
                    best = r->median_ms;
                    current = trial;
                }
            }
        }
}

void searchMixed(const Domain& domain, const ParameterSpace& space, const Evaluator& evaluate) {
    const BuildRoute def = BuildRoute::defaults(space);
    const CandidateResult* base = evaluate.evaluate(def);
    if (!base) return;
    const double base_ms = base->outcome == Outcome::Ok ? base->median_ms : 0;
    Domain winners;  // phase 2 domain: default plus the values that beat it
    for (const auto& [name, values] : domain) {
        std::vector<std::string> keep = {def.get(name)};
        const auto trials = variations(def, name, values, space);
        evaluate.prefetch(trials);
        for (const auto& trial : trials) {
            const CandidateResult* r = evaluate.evaluate(trial);
            if (!r) return;
            if (faster(r, base_ms)) keep.push_back(trial.get(name));
        }
        if (keep.size() > 1) winners.emplace_back(name, keep);
    }
    std::vector<BuildRoute> cross = {def};
    for (const auto& [name, values] : winners) {
        std::vector<BuildRoute> next;
        for (const auto& r : cross)
            for (const auto& v : values) {
                BuildRoute x = r;
                x.set(name, v, space);
                next.push_back(x);
            }
        cross = std::move(next);
    }
    searchExhaustive(cross, evaluate);
}

}  // namespace kiln
