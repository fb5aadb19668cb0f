// Token sampling: greedy (temperature 0), temperature, top-k, top-p and repetition
// penalty, reproducible from a seed.
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
};

class Sampler {
public:
    explicit Sampler(const SamplingParams& p);
    // Picks the next token from `logits`; `previous` are the sequence's tokens so far.
    int64_t next(std::span<const float> logits, std::span<const int64_t> previous);
    // True when next() is the argmax of the logits alone (lowest id on ties), which a model
    // can then find where it computes them.
    bool greedy() const { return params_.temperature == 0.f && params_.repetition_penalty == 1.f; }

private:
    SamplingParams params_;
    std::mt19937_64 rng_;
};

}  // namespace kiln::llm
