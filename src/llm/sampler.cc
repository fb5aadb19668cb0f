#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"

namespace kiln::llm {

Sampler::Sampler(const SamplingParams& p) : params_(p), rng_(p.seed) {
    check(p.temperature >= 0 && std::isfinite(p.temperature), "temperature must be >= 0");
    check(p.top_k >= 0, "top_k must be >= 0");
    check(p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1]");
    check(p.repetition_penalty > 0, "repetition_penalty must be > 0");
    check(p.presence_penalty >= -2 && p.presence_penalty <= 2, "presence_penalty must be in [-2, 2]");
    check(p.frequency_penalty >= -2 && p.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]");
}

int64_t Sampler::next(std::span<const float> logits_in, std::span<const int64_t> previous, std::span<const int64_t> generated) {
    check(!logits_in.empty(), "no logits to sample from");
    // The logits are copied only when a penalty changes them (a step samples many rows).
    std::span<const float> logits = logits_in;
    std::vector<float> penalized;
    const auto vocab = static_cast<int64_t>(logits_in.size());
    if (params_.repetition_penalty != 1.f) {  // as in CTRL / Hugging Face: shrink positive, grow negative
        penalized.assign(logits_in.begin(), logits_in.end());
        std::unordered_set<int64_t> seen(previous.begin(), previous.end());
        for (int64_t t : seen)
            if (t >= 0 && t < vocab) penalized[t] = penalized[t] > 0 ? penalized[t] / params_.repetition_penalty : penalized[t] * params_.repetition_penalty;
        logits = penalized;
    }
    if (params_.presence_penalty != 0.f || params_.frequency_penalty != 0.f) {
        if (penalized.empty()) penalized.assign(logits_in.begin(), logits_in.end());
        std::unordered_map<int64_t, int64_t> count;
        for (int64_t t : generated) ++count[t];
        for (const auto& [t, n] : count)
            if (t >= 0 && t < vocab) penalized[t] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(n);
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

TokenLogprob tokenLogprob(std::span<const float> logits, int64_t token, int64_t top) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
    const double log_z = mx + std::log(sum);
    TokenLogprob out{token, logits[static_cast<size_t>(token)] - log_z, {}};
    const size_t k = std::min(static_cast<size_t>(std::max<int64_t>(top, 0)), logits.size());
    std::vector<int64_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                      [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(order[i], logits[static_cast<size_t>(order[i])] - log_z);
    return out;
}

}  // namespace kiln::llm
