#include "tuner/statistics.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>

namespace kiln {

double medianOf(std::vector<double> v) {
    if (v.empty()) return 0;
    const size_t mid = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
    const double hi = v[mid];
    if (v.size() % 2) return hi;
    return (*std::max_element(v.begin(), v.begin() + static_cast<long>(mid)) + hi) / 2;
}

namespace {

double quantile(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(v.size() - 1, lo + 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

Interval speedupInterval(const RoundSamples& baseline, const RoundSamples& candidate, double confidence, int resamples, uint64_t seed) {
    std::vector<std::pair<const std::vector<double>*, const std::vector<double>*>> rounds;
    for (size_t r = 0; r < baseline.size() && r < candidate.size(); ++r)
        if (!baseline[r].empty() && !candidate[r].empty()) rounds.emplace_back(&baseline[r], &candidate[r]);
    if (rounds.empty()) return {1, 0, std::numeric_limits<double>::infinity()};
    auto ratioOf = [](double base, double cand) { return cand > 0 ? base / cand : std::numeric_limits<double>::infinity(); };
    std::vector<double> ratios;
    for (const auto& [b, c] : rounds) ratios.push_back(ratioOf(medianOf(*b), medianOf(*c)));
    Interval out;
    out.estimate = medianOf(ratios);
    std::mt19937_64 rng(seed);
    std::vector<double> estimates, resampled;
    estimates.reserve(static_cast<size_t>(resamples));
    auto resampledMedian = [&](const std::vector<double>& s) {
        std::uniform_int_distribution<size_t> pick(0, s.size() - 1);
        resampled.resize(s.size());
        for (double& x : resampled) x = s[pick(rng)];
        return medianOf(resampled);
    };
    for (int i = 0; i < resamples; ++i) {
        ratios.clear();
        for (const auto& [b, c] : rounds) {
            const double mb = resampledMedian(*b);
            ratios.push_back(ratioOf(mb, resampledMedian(*c)));
        }
        estimates.push_back(medianOf(ratios));
    }
    const double tail = (1 - confidence) / 2;
    out.low = quantile(estimates, tail);
    out.high = quantile(estimates, 1 - tail);
    // The point estimate lies inside its own interval even when few resamples disagree.
    out.low = std::min(out.low, out.estimate);
    out.high = std::max(out.high, out.estimate);
    return out;
}

std::string unstableSamples(const std::vector<double>& samples, double max_spread) {
    if (samples.size() < 3) return "";
    std::vector<double> s = samples;
    std::sort(s.begin(), s.end());
    const double median = medianOf(s);
    if (median <= 0) return "";
    const double spread = (quantile(s, 0.9) - quantile(s, 0.1)) / median;
    char text[160];
    if (spread > max_spread) {
        std::snprintf(text, sizeof text, "spread (p90 - p10) / median of %.0f%%", spread * 100);
        return text;
    }
    const size_t fifth = (s.size() + 4) / 5;
    for (size_t i = fifth; i + fifth <= s.size(); ++i) {
        const double gap = (s[i] - s[i - 1]) / median;
        if (gap > max_spread / 2) {
            std::snprintf(text, sizeof text, "two modes (%.3f and %.3f ms)", medianOf({s.begin(), s.begin() + static_cast<long>(i)}),
                          medianOf({s.begin() + static_cast<long>(i), s.end()}));
            return text;
        }
    }
    return "";
}

std::string machineLoad() {
    std::ifstream in("/proc/loadavg");
    double load = 0;
    if (!(in >> load)) return "";
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (load <= cores) return "";
    char text[120];
    std::snprintf(text, sizeof text, "load average %.1f on %d cores", load, cores);
    return text;
}

}  // namespace kiln
