// Search strategies over a domain of parameter values. A strategy asks for candidates
// through an Evaluator (which answers from the tuning cache when it can) and decides only
// from the answers, so replaying it against a filled cache retraces the same search —
// which is what makes --continue end with the uninterrupted result.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "route/build_route.h"
#include "tuner/candidate.h"

namespace kiln {

// evaluate: the candidate's result, or nullptr once the budget is spent.
// prefetch: a hint that these routes come next (lets --jobs build them in parallel).
struct Evaluator {
    std::function<const CandidateResult*(const BuildRoute&)> evaluate;
    std::function<void(const std::vector<BuildRoute>&)> prefetch = [](const std::vector<BuildRoute>&) {};
};

// The parameters a set of routes varies, with the values each takes (first-seen order).
using Domain = std::vector<std::pair<std::string, std::vector<std::string>>>;
Domain domainOf(const std::vector<BuildRoute>& routes, const ParameterSpace& space);

enum class Strategy { Exhaustive, Greedy, Mixed };
Strategy parseStrategy(const std::string& name);
std::string strategyName(Strategy s);

// The default, then each parameter of the domain changed alone to each of its other values:
// the first phase of greedy and mixed, in the order they evaluate it.
std::vector<BuildRoute> oneAtATimeRoutes(const Domain& domain, const ParameterSpace& space);

// Every route in order.
void searchExhaustive(const std::vector<BuildRoute>& routes, const Evaluator& evaluate);
// Coordinate descent from the default: for each parameter try each value, keep the fastest
// accurate one, then a second pass over all parameters.
void searchGreedy(const Domain& domain, const ParameterSpace& space, const Evaluator& evaluate);
// trtexec's "mixed": a one-at-a-time scan, then the cross product over the parameters whose
// values beat the default (only accurate candidates count).
void searchMixed(const Domain& domain, const ParameterSpace& space, const Evaluator& evaluate);

}  // namespace kiln
