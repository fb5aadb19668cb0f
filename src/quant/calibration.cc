// Calibration: running a float model over sample inputs and measuring the ranges of its
// quantization points (see calibration.h). The model is built as a CPU engine whose outputs
// include every point, so that the passes keep those values as they are (a fusion never
// swallows a graph output) and the fast kernels compute them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/builder.h"
#include "quant/calibration.h"
#include "runtime/context.h"

namespace kiln {

namespace {

constexpr int kBins = 2048;

// A histogram of values over [lo, hi] in kBins bins.
struct Histogram {
    double lo = 0, hi = 0;
    bool magnitudes = false;  // of |x| (entropy) rather than x
    std::vector<double> counts = std::vector<double>(kBins, 0.0);

    void add(const float* p, int64_t n) {
        const double width = (hi - lo) / kBins;
        if (!(width > 0)) return;
        for (int64_t i = 0; i < n; ++i) {
            if (!std::isfinite(p[i])) continue;
            const double v = magnitudes ? std::fabs(p[i]) : p[i];
            const int b = std::clamp(static_cast<int>((v - lo) / width), 0, kBins - 1);
            counts[static_cast<size_t>(b)] += 1;
        }
    }
    // The value below which fraction q of the counts lie.
    double quantile(double q) const {
        double total = 0;
        for (double c : counts) total += c;
        double seen = 0;
        for (int b = 0; b < kBins; ++b) {
            seen += counts[static_cast<size_t>(b)];
            if (seen >= q * total) return lo + (hi - lo) * (b + 1) / kBins;
        }
        return hi;
    }
};

// TensorRT's entropy calibration on the histogram of |x| over [0, amax]: the threshold
// (a bin edge from 128 bins up) whose clipped distribution, merged into 128 levels and
// expanded back, has the least KL divergence from the clipped original.
double entropyThreshold(const Histogram& h) {
    const std::vector<double>& hist = h.counts;
    constexpr int kLevels = 128;
    double best_kl = std::numeric_limits<double>::infinity();
    int best = kBins;
    for (int i = kLevels; i <= kBins; ++i) {
        std::vector<double> p(hist.begin(), hist.begin() + i);
        for (int b = i; b < kBins; ++b) p[static_cast<size_t>(i - 1)] += hist[static_cast<size_t>(b)];  // outliers onto the edge
        std::vector<double> q(static_cast<size_t>(i), 0.0);
        const double per = static_cast<double>(i) / kLevels;
        for (int level = 0; level < kLevels; ++level) {
            const int b0 = static_cast<int>(std::floor(level * per)), b1 = std::max(b0 + 1, static_cast<int>(std::floor((level + 1) * per)));
            double sum = 0;
            int nonzero = 0;
            for (int b = b0; b < b1 && b < i; ++b) sum += hist[static_cast<size_t>(b)], nonzero += hist[static_cast<size_t>(b)] > 0;
            for (int b = b0; b < b1 && b < i; ++b)
                if (hist[static_cast<size_t>(b)] > 0) q[static_cast<size_t>(b)] = sum / nonzero;
        }
        double sp = 0, sq = 0;
        for (int b = 0; b < i; ++b) sp += p[static_cast<size_t>(b)], sq += q[static_cast<size_t>(b)];
        if (sp <= 0 || sq <= 0) continue;
        double kl = 0;
        for (int b = 0; b < i; ++b) {
            const double pb = p[static_cast<size_t>(b)] / sp, qb = q[static_cast<size_t>(b)] / sq;
            if (pb > 0) kl += qb > 0 ? pb * std::log(pb / qb) : pb * 30.0;  // a level q cannot hold: heavily penalized
        }
        if (kl < best_kl) best_kl = kl, best = i;
    }
    return h.hi * best / kBins;
}

}  // namespace

CalibrationTable calibrate(const Graph& g, const std::string& model_hash, const std::vector<TensorMap>& samples, const std::string& method,
                           const std::function<void(size_t, size_t)>& progress) {
    check(!samples.empty(), "calibration needs at least one sample input");
    double percentile = 0;
    if (method.rfind("percentile:", 0) == 0) {
        try {
            percentile = std::stod(method.substr(11));
        } catch (const std::exception&) {
            percentile = 0;
        }
        check(percentile > 50 && percentile <= 100, "--method " + method + ": the percentile must be above 50 and at most 100");
    } else {
        check(method == "minmax" || method == "entropy", "--method " + method + ": expected minmax, entropy or percentile:P (e.g. percentile:99.99)");
    }
    Graph probe = withConstantsAsInitializers(g);
    const std::vector<std::string> points = quantizationPoints(probe);
    check(!points.empty(), "the model has no Conv, MatMul or Gemm with constant f32 weights to quantize");
    const size_t first = probe.outputs.size();
    for (const auto& p : points) probe.outputs.push_back({p, DType::F32, Shape::unknown()});
    Builder builder(probe, model_hash, "cpu");
    ShapeProfile profile;
    for (const auto& [name, t] : samples[0])
        if (const ValueInfo* vi = g.findValueInfo(name); vi && !vi->shape.fullyKnown()) profile[name] = ShapeRange{t.dims(), t.dims(), t.dims()};
    builder.setShapeProfile(profile);
    const Engine engine = builder.build();
    ExecutionContext context(engine);
    const bool histograms = method != "minmax";
    const size_t total = samples.size() * (histograms ? 2 : 1);
    std::vector<TensorRange> range(points.size(), {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()});
    std::vector<Histogram> hist(points.size());
    size_t done = 0;
    for (int pass = 0; pass < (histograms ? 2 : 1); ++pass) {
        for (const auto& sample : samples) {
            const std::vector<Tensor> outs = context.run(sample);
            for (size_t k = 0; k < points.size(); ++k) {
                const Tensor& t = outs[first + k];
                check(t.dtype() == DType::F32, "calibration: '" + points[k] + "' is " + t.summary() + ", not f32");
                const float* p = t.data<float>();
                if (pass == 0) {
                    for (int64_t i = 0; i < t.numel(); ++i)
                        if (std::isfinite(p[i])) range[k].min = std::min(range[k].min, double(p[i])), range[k].max = std::max(range[k].max, double(p[i]));
                } else {
                    hist[k].add(p, t.numel());
                }
            }
            if (progress) progress(++done, total);
        }
        if (pass == 0 && histograms)
            for (size_t k = 0; k < points.size(); ++k) {
                // Percentiles over the values, entropy over their magnitudes.
                const double amax = std::max(std::fabs(range[k].min), std::fabs(range[k].max));
                hist[k].magnitudes = method == "entropy";
                hist[k].lo = method == "entropy" ? 0.0 : range[k].min;
                hist[k].hi = method == "entropy" ? amax : range[k].max;
            }
    }
    CalibrationTable table{model_hash, method, static_cast<int>(samples.size()), {}};
    for (size_t k = 0; k < points.size(); ++k) {
        TensorRange r = range[k];
        if (!(r.min <= r.max)) continue;  // never finite: left in f32
        if (method == "entropy") {
            const double t = entropyThreshold(hist[k]);
            r = {std::max(r.min, -t), std::min(r.max, t)};
        } else if (percentile > 0) {
            r = {std::min(r.min >= 0 ? r.min : hist[k].quantile(1 - percentile / 100), 0.0), hist[k].quantile(percentile / 100)};
            r.min = std::max(r.min, range[k].min);
        }
        table.ranges[points[k]] = r;
    }
    return table;
}

}  // namespace kiln
