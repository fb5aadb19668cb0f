// Building, validating and timing one candidate route in an isolated child process, so a
// crash, abort or hang in one candidate is recorded and the search goes on.
#pragma once
#include <string>
#include <vector>

#include "engine/builder.h"
#include "runtime/executor.h"

namespace kiln {

enum class Outcome { Ok, BuildError, Crash, Timeout, AccuracyFail };
std::string outcomeName(Outcome o);
Outcome parseOutcome(const std::string& name);

// Inputs and the outputs they must produce (from the user, or the f32 reference build).
struct Golden {
    TensorMap inputs;
    std::vector<Tensor> outputs;
    std::string source;  // where they came from, for the report
};

// The accuracy criterion: every output's metric must be within `value`.
// Metrics: max-abs, rel-l2 (both must be <= value), cosine (>= value).
struct Tolerance {
    std::string metric = "rel-l2";
    double value = 1e-3;
    static Tolerance parse(const std::string& text);  // "rel-l2=1e-3"
};

struct MeasurePolicy {
    int warmup = 3;
    int iterations = 10;
    double timeout_s = 120;
};

struct CandidateResult {
    std::string route;       // canonical text
    std::string route_hash;
    Outcome outcome = Outcome::Crash;
    std::string message;     // error text, or the measured error for accuracy_fail
    double error = 0;        // worst output's metric value
    std::vector<double> samples_ms;
    double median_ms = 0;
    double spread = 0;       // (p90 - p10) / median of the samples
};

// Evaluates one route in a forked child. Never throws for a candidate's own failure.
CandidateResult evaluateCandidate(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                                  const Tolerance& tolerance, const MeasurePolicy& policy);

// Median and relative spread of samples.
void summarizeSamples(CandidateResult& r);

}  // namespace kiln
