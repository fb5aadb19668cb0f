#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "ir/error.h"

namespace kiln::llm {

Sampler::Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {
    check(p.temperature >= 0 && std::isfinite(p.temperature), "temperature must be >= 0");
    check(p.top_k >= 0, "top_k must be >= 0");
    check(p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1]");
    check(p.repetition_penalty > 0, "repetition_penalty must be > 0");
}

int64_t Sampler::next(std::span<const float> logits_in, std::span<const int64_t> previous) {
    check(!logits_in.empty(), "no logits to sample from");
    // The logits are copied only when the repetition penalty changes them (a step samples many rows).
    std::span<const float> logits = logits_in;
    std::vector<float> penalized;
    if (params_.repetition_penalty != 1.f) {  // as in CTRL / Hugging Face: shrink positive, grow negative
        penalized.assign(logits_in.begin(), logits_in.end());
        std::unordered_set<int64_t> seen(previous.begin(), previous.end());
        for (int64_t t : seen)
            if (t >= 0 && t < static_cast<int64_t>(penalized.size()))
                penalized[t] = penalized[t] > 0 ? penalized[t] / params_.repetition_penalty : penalized[t] * params_.repetition_penalty;
        logits = penalized;
    }
    if (params_.temperature == 0.f) return std::max_element(logits.begin(), logits.end()) - logits.begin();
    std::vector<int64_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    size_t keep = params_.top_k > 0 ? std::min<size_t>(order.size(), static_cast<size_t>(params_.top_k)) : order.size();
    std::vector<double> prob(keep);
    const double mx = logits[order[0]];
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[order[i]] - mx) / params_.temperature));
    double mass = 0;
    size_t nucleus = keep;
    for (size_t i = 0; i < keep; ++i) {
        mass += prob[i] / sum;
        if (mass >= params_.top_p) {
            nucleus = i + 1;
            break;
        }
    }
    std::discrete_distribution<size_t> pick(prob.begin(), prob.begin() + nucleus);
    return order[pick(rng_)];
}

}  // namespace kiln::llm
