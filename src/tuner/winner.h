// The tuner's decision: the finalists and the parameters' effects re-measured in
// interleaved rounds, each judged by its speedup interval over the default; a win only
// where the interval clears --min-gain on a quiet machine, ties to the simplest route, and
// --verify's fresh re-measurement of the winner against the default.
#pragma once
#include <functional>
#include <vector>

#include "tuner/tuner.h"

namespace kiln {

// Samples of one candidate for one re-measurement round (empty when it failed).
using Remeasure = std::function<std::vector<double>(const CandidateResult&, int round)>;
// A fresh build and measurement of a route, in its own process.
using MeasureFresh = std::function<CandidateResult(const BuildRoute&)>;

void chooseWinner(TuneResult& result, const TunerOptions& o, const Remeasure& remeasure, const MeasureFresh& fresh);

}  // namespace kiln
