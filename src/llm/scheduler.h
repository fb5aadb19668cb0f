// In-flight batching: requests join the running batch at every step. Each step gives every
// running sequence either one decode token or a chunk of its prompt (chunked prefill),
// within max_num_tokens tokens and max_batch_size sequences. When the KV cache runs out
// of blocks, the newest running sequence is preempted: its blocks are freed and it goes
// back to the front of the queue with the tokens it generated, to be recomputed later, so
// no request is lost or changed. Stop tokens, max_tokens and cancellation end requests.
#pragma once
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llm/language_model.h"
#include "llm/sampler.h"

namespace kiln::llm {

struct Request {
    std::vector<int64_t> prompt;
    int64_t max_tokens = 16;
    std::vector<int64_t> stop_tokens;
    bool ignore_eos = false;  // else the model's eos_token_ids end it too (vLLM's ignore_eos)
    SamplingParams sampling;
    int64_t logprobs = -1;    // >= 0: each token's log-probability and that many top alternatives
};


enum class FinishReason { None, Length, Stop, Cancelled, ContextLength };

// The KV-cache slots a request can come to need: its prompt and generated tokens up to
// the context, less the last token generated, which is never fed back. The scheduler
// refuses a request whose need passes the whole cache; the server checks it first.
inline int64_t kvSlotsNeeded(int64_t prompt_tokens, int64_t max_tokens, int64_t max_positions) {
    return prompt_tokens + std::min(max_tokens, std::max<int64_t>(0, max_positions - prompt_tokens)) - 1;
}

struct RequestState {
    int64_t id = 0;
    Request request;
    std::vector<int64_t> output;  // generated tokens
    std::vector<TokenLogprob> logprobs;  // per generated token, when the request asks
    FinishReason finished = FinishReason::None;
    int64_t preemptions = 0;
    std::string error;  // why it ended, when it failed (finished is then Cancelled)
    Sampler sampler{SamplingParams{}};  // kept across preemption: seeded draws continue where they were
};

struct SchedulerOptions {
    int64_t max_batch_size = 8;
    int64_t max_num_tokens = 64;  // tokens computed per step (prompt chunks + decodes)
    int64_t block_size = 16;
    int64_t num_blocks = 256;
};

struct StepStats {
    int64_t sequences = 0, prefill_tokens = 0, decode_tokens = 0, preempted = 0;
};

class Scheduler {
public:
    Scheduler(const LanguageModel& model, SchedulerOptions options);
    int64_t add(Request r);
    void cancel(int64_t id);
    // Runs one step; returns false when nothing is left to do.
    bool step(StepStats* stats = nullptr);
    void runToCompletion();
    const RequestState& state(int64_t id) const { return states_.at(id); }
    const PagedKvCache& cache() const { return cache_; }
    // Called with (request id, new token) as tokens are generated (streaming).
    std::function<void(int64_t, int64_t)> on_token;

private:
    struct Running {
        int64_t id, seq;
        std::vector<int64_t> tokens;  // prompt + generated, what the cache must hold
        int64_t computed = 0;         // tokens already in the cache
    };
    void finish(Running& r, FinishReason why);
    void preemptNewest();

    const LanguageModel& model_;
    SchedulerOptions options_;
    PagedKvCache cache_;
    std::map<int64_t, RequestState> states_;
    std::deque<int64_t> waiting_;
    std::vector<Running> running_;  // in admission order
    int64_t next_id_ = 0;
};

}  // namespace kiln::llm
