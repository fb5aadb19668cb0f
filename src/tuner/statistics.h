// The tuner's statistics: speedups from interleaved rounds with bootstrap intervals, and the
// signs of a machine too noisy to decide on (wide or bimodal samples, a high load average).
// The design follows bench/ort_compare.py: a ratio per round, so drift between rounds lands
// on both routes, and the median of the ratios.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// A speedup (baseline time / candidate time) and its confidence interval.
struct Interval {
    double estimate = 1, low = 1, high = 1;
};

// Samples (ms) of one route, one vector per interleaved round.
using RoundSamples = std::vector<std::vector<double>>;

// The median over rounds of median(baseline) / median(candidate) per round, and a bootstrap
// interval (each round's samples resampled with replacement, `resamples` times, seeded).
// Rounds where either side has no samples are skipped; none left gives {1, 0, inf}.
Interval speedupInterval(const RoundSamples& baseline, const RoundSamples& candidate, double confidence = 0.95, int resamples = 1000, uint64_t seed = 1);

// Why samples cannot be trusted ("" when they can): a spread (p90 - p10) / median above
// max_spread, or two modes (a gap between consecutive sorted samples of more than half
// max_spread of the median, with at least a fifth of the samples on each side).
std::string unstableSamples(const std::vector<double>& samples, double max_spread);

// Why the machine is too loaded to time on ("" when it is not): the 1-minute load average
// above the cores this process may use (Linux /proc/loadavg; elsewhere never loaded).
std::string machineLoad();

double medianOf(std::vector<double> v);

}  // namespace kiln
