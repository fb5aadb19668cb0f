// `kiln tune MODEL_DIR`: a search over the LLM runtime's parameters (llm/llm_parameters.h).
// Each candidate runs one fixed serving workload (greedy requests of seeded random prompts,
// all arriving at once under a concurrency limit), in interleaved rounds with the default;
// its greedy tokens must agree with the default's, and a win must clear --min-gain with
// its bootstrap interval, as for engines (tuner/statistics.h).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "llm/language_model.h"
#include "llm/scheduler.h"
#include "route/build_route.h"
#include "tuner/statistics.h"

namespace kiln {

struct LlmWorkload {
    int64_t requests = 8, concurrency = 4, input_len = 32, output_len = 16;
    int64_t max_batch_size = 8, num_blocks = 256;
    uint64_t seed = 0;
};

// One run of the workload: per-request figures in ms, and each request's greedy tokens.
struct LlmRun {
    std::vector<double> ttft_ms, tpot_ms;  // per request
    double ms_per_output_token = 0;        // wall time over all output tokens (1000 / throughput)
    std::vector<std::vector<int64_t>> tokens;
};
LlmRun runLlmWorkload(const llm::LanguageModel& model, const llm::SchedulerOptions& scheduler, const LlmWorkload& workload);

// Tokens that match `reference` before each request's first difference, over all of the
// reference's tokens (1 when equal; greedy decoding diverges for good after one change).
double tokenAgreement(const std::vector<std::vector<int64_t>>& reference, const std::vector<std::vector<int64_t>>& got);

struct LlmTunePolicy {
    std::string target = "cpu";
    int tp = 1;
    std::string expr;                // empty: one-at-a-time over the parameters that apply on the target
    std::string objective = "tpot";  // tpot | ttft | throughput
    int rounds = 3;
    double min_gain = 0.03;
    double min_agreement = 0.9;
    double max_spread = 0.5;
    uint64_t seed = 0;
    LlmWorkload workload;
};

struct LlmCandidate {
    BuildRoute route;
    std::string changes;  // from the default
    RoundSamples samples;  // objective samples (ms) per round
    double median_ms = 0;
    double agreement = 1;
    Interval speedup;
    std::string rejected;  // why it cannot win ("" when it can)
};

struct LlmTuneResult {
    std::string expression, objective;
    std::vector<LlmCandidate> candidates;  // the default first
    int winner = 0;                        // index; 0 keeps the default
    bool significant = false;
    std::string noise;  // why the timing could not be trusted, when it could not
};

// The candidate routes (the default first), over the parameters that apply on the target.
std::vector<BuildRoute> planLlmTune(const LlmTunePolicy& policy, std::string* expression = nullptr);

// `load` makes a model for a route (the runtime options it sets); called again only when
// a candidate's load-time options differ from the model at hand. `progress(done, total)`.
LlmTuneResult tuneLlm(const LlmTunePolicy& policy, const std::function<std::unique_ptr<llm::LanguageModel>(const BuildRoute&)>& load,
                      const std::function<void(size_t, size_t)>& progress = {});

}  // namespace kiln
