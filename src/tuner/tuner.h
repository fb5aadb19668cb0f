// The Global Performance Tuner: searches build routes with a strategy, evaluates each
// candidate in an isolated child process (build, accuracy check against golden data,
// timing), records every result in a tuning cache, re-measures the finalists interleaved
// and picks the fastest accurate route, keeping the default unless the speedup's interval
// clears --min-gain on a quiet machine (winner.h).
#pragma once
#include <functional>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "tuner/candidate.h"
#include "tuner/strategy.h"

namespace kiln {

// --budget: a number of new candidates, or a time ("90s", "10m", "1h").
struct Budget {
    size_t candidates = 0;  // 0 = unlimited
    double seconds = 0;     // 0 = unlimited
    static Budget parse(const std::string& text);
};

struct TunerOptions {
    std::string model_path;
    std::string expr;                 // "" = every value of the parameters that affect the model
    std::optional<Strategy> strategy; // unset: exhaustive when the expression gives <= 64 routes, else mixed
    std::string golden_dir;           // "" = seeded random inputs, outputs of the unoptimized f32 reference
    std::map<std::string, Dims> input_shapes;  // --shapes: concrete shapes for random inputs with symbolic dims
    // What a candidate's time is, with a shape profile (policy.profile): its time at the opt
    // shapes ("opt"), or the geometric mean of its times at min, opt and max ("geomean").
    // Accuracy is checked at all three either way.
    std::string objective = "opt";
    std::string calib_path;           // --calib (loaded into policy.calibration), for the report's rebuild command
    AccuracyCriterion tolerance;
    MeasurePolicy policy;
    std::string cache_path;
    bool resume = false;              // --continue
    Budget budget;
    size_t jobs = 1;                  // candidates built and validated in parallel (timing stays one at a time)
    double min_gain = 0.03;
    size_t finalists = 5;
    size_t effects = 6;               // single-parameter changes re-measured for the effects table
    int rounds = 3;
    int verify = 0;                   // --verify N: fresh builds of the winner and the default, N rounds
    // Samples spread wider than this (p90 - p10 over the median), or in two modes half this
    // far apart, are noise. Sub-millisecond runs on a quiet 2-core VM spread 15-40%.
    double max_spread = 0.5;
    uint64_t seed = 0;
    // Called after each candidate: (candidates so far, expected total or 0, result, best median so far).
    std::function<void(size_t, size_t, const CandidateResult&, double)> progress;
    // Evaluates batches of routes elsewhere (MPI workers); results in the routes' order.
    std::function<std::vector<CandidateResult>(const std::vector<BuildRoute>&)> remote_batch;
    // Replaces the isolated build-and-measure step (tests use it for deterministic timings).
    std::function<CandidateResult(const BuildRoute&)> evaluate_override;
    // Why the machine is too loaded to time on ("" when it is not); tests replace it.
    std::function<std::string()> machine_load = machineLoad;
};

struct ParameterEffect {
    std::string parameter, value;
    double relative_latency;  // candidate / default time (one parameter changed), re-measured
    double low, high;         // its interval
};

struct TuneResult {
    std::string expression;
    std::string strategy;
    std::string golden_source;
    std::vector<CandidateResult> candidates;  // in search order, cached or new
    size_t from_cache = 0;
    bool budget_exhausted = false;
    std::vector<CandidateResult> finalists;   // re-measured, fastest first
    CandidateResult default_result;
    std::string best_route;                   // canonical text of the chosen route
    double best_gain = 0;                     // fastest finalist's gain over the default
    double speedup = 1.0;                     // the chosen route's speedup over the default
    Interval speedup_interval;                // and its interval
    bool significant = false;
    std::string noise;                        // why the timing could not be trusted ("" when it could)
    bool verified = false, win_held = false;  // --verify ran; the win held
    Interval verification;                    // --verify's measured speedup
    std::vector<ParameterEffect> effects;
    std::vector<std::string> warnings;
};

// What a tune run will search, before anything is built (--dry-run): the expression, the
// strategy, and the routes it builds — all of them for exhaustive; for greedy and mixed the
// first phase, with the rule that picks the rest from its results.
struct TunePlan {
    std::string expression, strategy;
    std::vector<BuildRoute> routes;
    bool adaptive = false;  // routes is phase 1; `rule` says what follows
    std::string rule;
    double combinations = 0;  // routes the parameters' values span
    Domain domain;            // the parameters searched and their values
};
TunePlan planTune(const TunerOptions& options, const Graph& model);

TuneResult tune(const TunerOptions& options);

// The worker side of a distributed search: loads the model and golden data as `tune`
// would, then evaluates each route `next` hands out (until it returns false) and passes
// the result to `send`.
void runTuneWorker(const TunerOptions& options, const std::function<bool(std::string*)>& next, const std::function<void(const CandidateResult&)>& send);

// Writes the report by the file's extension: .json, .md or .html (with an SVG latency plot).
void writeTuneReport(const TuneResult& result, const TunerOptions& options, const std::string& path);

}  // namespace kiln
