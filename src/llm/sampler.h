// Token sampling: greedy (temperature 0), temperature, top-k, top-p, the repetition penalty
// (Hugging Face's) and presence/frequency penalties (OpenAI's), reproducible from a seed.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kiln::llm {

struct SamplingParams {
    float temperature = 0.f;         // 0: greedy
    int64_t top_k = 0;               // 0: all tokens
    float top_p = 1.f;               // nucleus mass
    float repetition_penalty = 1.f;  // > 1 discourages tokens already in the sequence
    uint64_t seed = 0;
    // OpenAI's: each generated token's logit less presence (once it occurred) and frequency
    // times its count so far; in [-2, 2].
    float presence_penalty = 0.f, frequency_penalty = 0.f;
};

// A generated token's log-probability under the model (log-softmax of its logits, before
// sampling's penalties and temperature), and the most likely tokens at that step.
struct TokenLogprob {
    int64_t token = 0;
    double logprob = 0;
    std::vector<std::pair<int64_t, double>> top;  // best first, ties by the lower id
};
TokenLogprob tokenLogprob(std::span<const float> logits, int64_t token, int64_t top);

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // Picks the next token from `logits`; `previous` are the sequence's tokens so far (prompt
    // and generated: the repetition penalty), `generated` the generated ones (presence and
    // frequency penalties).
    int64_t next(std::span<const float> logits, std::span<const int64_t> previous, std::span<const int64_t> generated = {});
    // True when next() is the argmax of the logits alone (lowest id on ties), which a model
    // can then find where it computes them.
    bool greedy() const {
        return params_.temperature == 0.f && params_.repetition_penalty == 1.f && params_.presence_penalty == 0.f && params_.frequency_penalty == 0.f;
    }

private:
    SamplingParams params_;
    std::mt19937_64 rng_;
};

}  // namespace kiln::llm
