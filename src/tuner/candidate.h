// Building, validating and timing one candidate route in an isolated child process, so a
// crash, abort or hang in one candidate is recorded and the search goes on.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/builder.h"
#include "quant/qdq_insertion.h"
#include "backends/cpu/graph_executor.h"
#include "tuner/statistics.h"

namespace kiln {

enum class Outcome { Ok, BuildError, Crash, Timeout, AccuracyFail };
std::string outcomeName(Outcome o);
Outcome parseOutcome(const std::string& name);

// Inputs and the outputs they must produce (from the user, or the f32 reference build), at
// one point of the shape profile.
struct GoldenCase {
    std::string label;  // "opt", "min", "max" (the profile point), "" without a profile
    TensorMap inputs;
    std::vector<Tensor> outputs;
    bool timed = true;  // part of the objective; every case is checked for accuracy
};

struct Golden {
    std::vector<GoldenCase> cases;  // cases[0]: the golden data proper (the profile's opt shapes)
    std::string source;             // where they came from, for the report
};

// One output's accuracy criterion. Metrics: max-abs and rel-l2 (must be <= value), cosine
// (must be >= value), top-k (value K: in every row of the last axis, the candidate's top-1
// index must be among the golden top-K).
struct Tolerance {
    std::string metric = "rel-l2";
    double value = 1e-3;
    // "rel-l2=1e-3"; with "OUTPUT:" in front it applies to that output only (*output is set).
    static Tolerance parse(const std::string& text, std::string* output = nullptr);
    bool passes(double measured) const;
    // How much of the tolerance a measured value uses (1 at the limit, above 1 past it).
    double usedFraction(double measured) const;
    double worstOf(double a, double b) const;
    double measure(const Tensor& got, const Tensor& want, const std::string& name) const;
    std::string text() const;
};

// The criterion for all outputs: a default and per-output overrides.
struct AccuracyCriterion {
    Tolerance fallback;
    std::map<std::string, Tolerance> per_output;
    static AccuracyCriterion parse(const std::vector<std::string>& specs);
    const Tolerance& forOutput(const std::string& name) const;
    std::string text() const;
};

struct MeasurePolicy {
    int warmup = 3;
    int iterations = 10;
    double timeout_s = 120;
    std::string target = "cpu";  // where candidates are built and timed (cuda: GPU compute by device events)
    ShapeProfile profile;        // --minShapes/--optShapes/--maxShapes: every candidate is built for it
    std::shared_ptr<const CalibrationTable> calibration;  // --calib: ranges for int8 routes
};

// The target's signature, read in a child process for cuda: a parent that starts CUDA
// before forking leaves its children unable to use the GPU.
std::string isolatedTargetSignature(const std::string& target);

struct CandidateResult {
    std::string route;       // canonical text
    std::string route_hash;
    Outcome outcome = Outcome::Crash;
    std::string message;     // error text, or the measured error for accuracy_fail
    double error = 0;        // the metric value of the worst output (failed), or of the one nearest its tolerance (passed)
    std::vector<double> samples_ms;
    double median_ms = 0;
    double spread = 0;       // (p90 - p10) / median of the samples
    std::string measured_by; // "local", or the MPI rank that built and timed it
    Interval speedup;        // finalists: over the default, from the interleaved rounds
    std::string engine_id;   // Builder::engineIdentity of its engine (built candidates)
    // The route hash of an earlier candidate that built an engine of the same identity: this
    // one was not timed, and carries that one's samples (a tie by construction).
    std::string same_engine_as;
};

// Engine identities already measured in a search, each with the route hash that measured it.
using KnownEngines = std::map<std::string, std::string>;

// JSON text form (tuning cache lines and MPI messages); fromJson throws on malformed input.
std::string candidateToJson(const CandidateResult& r, const std::map<std::string, std::string>& extra = {});
CandidateResult candidateFromJson(const std::string& text);

// Evaluates one route in a forked child. Never throws for a candidate's own failure. A
// candidate whose engine is one of `known` is validated but not timed (same_engine_as set).
CandidateResult evaluateCandidate(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                                  const AccuracyCriterion& accuracy, const MeasurePolicy& policy, const KnownEngines& known = {});

// Parallel builds (--jobs): children build and validate up to `jobs` routes at a time and
// leave each passing engine in `work_dir`; measurePrepared then times them one at a time.
struct PreparedCandidate {
    CandidateResult result;  // final unless outcome is ok (then only validated)
    std::string engine_path;
};
std::vector<PreparedCandidate> prepareCandidates(const Graph& model, const std::string& model_hash, const std::vector<BuildRoute>& routes, const Golden& golden,
                                                 const AccuracyCriterion& accuracy, const MeasurePolicy& policy, size_t jobs, const std::string& work_dir);
CandidateResult measurePrepared(const PreparedCandidate& prepared, const Golden& golden, const MeasurePolicy& policy);

// Median and relative spread of samples.
void summarizeSamples(CandidateResult& r);

}  // namespace kiln
