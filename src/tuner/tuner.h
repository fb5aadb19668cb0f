// The Global Performance Tuner: expands a route expression, evaluates each candidate in an
// isolated child process (build, accuracy check against golden data, timing), keeps
// results in a tuning cache, re-measures the finalists interleaved and picks the fastest
// accurate route, keeping the default unless the gain is beyond noise and --min-gain.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tuner/candidate.h"

namespace kiln {

struct TunerOptions {
    std::string model_path;
    std::string expr;          // "" = one-at-a-time over the parameters that affect the model
    std::string golden_dir;    // "" = seeded random inputs, outputs from the unoptimized f32 reference
    Tolerance tolerance;
    MeasurePolicy policy;
    std::string cache_path;
    bool resume = false;       // --continue
    size_t budget = 0;         // max new candidates to evaluate (0 = all)
    double min_gain = 0.03;
    size_t finalists = 5;
    int rounds = 3;
    uint64_t seed = 0;
    // Called after each candidate: (index, total, result, best median so far or 0).
    std::function<void(size_t, size_t, const CandidateResult&, double)> progress;
};

struct TuneResult {
    std::string expression;    // the expression searched (the default one when none was given)
    std::string golden_source;
    std::vector<CandidateResult> candidates;  // every candidate of the search, cached or new
    size_t from_cache = 0;
    std::vector<CandidateResult> finalists;   // re-measured, fastest first
    CandidateResult default_result;
    std::string best_route;    // canonical text of the chosen route
    double speedup = 1.0;      // default median / chosen median
    bool significant = false;  // whether the winner beat the default beyond noise and min-gain
    std::vector<std::string> warnings;
};

TuneResult tune(const TunerOptions& options);

// Writes the report as JSON or Markdown, by the file's extension (.json / .md).
void writeTuneReport(const TuneResult& result, const TunerOptions& options, const std::string& path);

}  // namespace kiln
