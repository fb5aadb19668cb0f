// The GPU decoder's step as it really runs (CUDA graph, kernels overlapping through
// programmatic dependent launch), for tuning the decoder itself: KILN_LLM_PROFILE=timeline
// has every CTA note its start, the end of its wait for the previous kernel and its end
// (decoder_kernels.h, CtaTraceRecord). Each decode step's records are grouped into launches,
// and each launch is charged with how far it moves the step's end past the previous
// launch's end. The report goes to stderr when the model is destroyed.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "llm/cuda/decoder_kernels.h"

namespace kiln::llm::cuda {

class StepTimeline {
public:
    StepTimeline() {
        const char* env = std::getenv("KILN_LLM_PROFILE");
        if (!env || std::string(env) != "timeline") return;
        if (cudaMalloc(reinterpret_cast<void**>(&records_), sizeof(CtaTraceRecord) * kCapacity) != cudaSuccess ||
            cudaMalloc(reinterpret_cast<void**>(&used_), sizeof(unsigned)) != cudaSuccess)
            return;
        setTraceSink(records_, used_, kCapacity);
        on_ = true;
    }
    StepTimeline(const StepTimeline&) = delete;
    StepTimeline& operator=(const StepTimeline&) = delete;
    ~StepTimeline() {
        if (steps_ > 0) std::fputs(report().c_str(), stderr);
        if (on_) setTraceSink(nullptr, nullptr, 0);
        cudaFree(records_);
        cudaFree(used_);
    }

    bool on() const { return on_; }
    // Before the step's first kernel.
    void stepBegin(cudaStream_t s) {
        if (on_) cudaMemsetAsync(used_, 0, sizeof(unsigned), s);
    }
    // After the stream synchronized; only decode-only steps are analysed.
    void stepDone(bool decode_only) {
        if (!on_ || !decode_only) return;
        unsigned used = 0;
        cudaMemcpy(&used, used_, sizeof used, cudaMemcpyDeviceToHost);
        std::vector<CtaTraceRecord> r(std::min(used, kCapacity));
        cudaMemcpy(r.data(), records_, sizeof(CtaTraceRecord) * r.size(), cudaMemcpyDeviceToHost);
        analyse(r);
    }

private:
    static constexpr unsigned kCapacity = 1u << 20;

    struct Launch {
        std::string label;
        unsigned long long t0 = ~0ull, waited = 0, t1 = 0;
    };
    struct Totals {
        double launches = 0, advance_ns = 0, release_ns = 0, after_wait_ns = 0, span_ns = 0;
    };

    static std::string label(const CtaTraceRecord& r) {
        static const char* names[] = {"?", "embed", "add+norm", "gemv", "qkv to cache", "attention", "mlp activation", "argmax"};
        const char* name = r.kind > 0 && r.kind <= kCtaArgmax ? names[r.kind] : names[0];
        if (r.kind == kCtaSmallGemm) return std::string(name) + " " + std::to_string(r.n) + "x" + std::to_string(r.k);
        return name;
    }

    // CTAs of one kernel shape sorted by start come launch after launch (the same shape
    // recurs only kernels later), `grid` CTAs each.
    void analyse(const std::vector<CtaTraceRecord>& records) {
        std::map<std::tuple<int, int, int, int>, std::vector<CtaTraceRecord>> by_shape;
        for (const auto& r : records) by_shape[{r.kind, r.n, r.k, r.grid}].push_back(r);
        std::vector<Launch> launches;
        for (auto& [shape, rs] : by_shape) {
            const size_t grid = static_cast<size_t>(std::get<3>(shape));
            if (grid == 0 || rs.size() % grid != 0) return;  // records lost: skip the step
            std::sort(rs.begin(), rs.end(), [](const auto& a, const auto& b) { return a.start < b.start; });
            for (size_t i = 0; i < rs.size(); i += grid) {
                Launch l{label(rs[i])};
                for (size_t j = i; j < i + grid; ++j) l.t0 = std::min(l.t0, rs[j].start), l.waited = std::max(l.waited, rs[j].waited), l.t1 = std::max(l.t1, rs[j].end);
                launches.push_back(l);
            }
        }
        if (launches.empty()) return;
        std::sort(launches.begin(), launches.end(), [](const Launch& a, const Launch& b) { return a.t0 < b.t0; });
        unsigned long long prev_end = launches.front().t0, step_end = 0;
        for (const Launch& l : launches) {
            Totals& t = totals_[l.label];
            t.launches += 1;
            t.advance_ns += l.t1 > prev_end ? double(l.t1 - prev_end) : 0.0;
            if (l.waited) t.release_ns += l.waited > prev_end ? double(l.waited - prev_end) : 0.0, t.after_wait_ns += double(l.t1 - std::max(l.waited, l.t0));
            t.span_ns += double(l.t1 - l.t0);
            prev_end = std::max(prev_end, l.t1);
            step_end = std::max(step_end, l.t1);
        }
        step_ns_.push_back(double(step_end - launches.front().t0));
        ++steps_;
    }

    std::string report() const {
        std::vector<double> sorted = step_ns_;
        std::sort(sorted.begin(), sorted.end());
        char line[200];
        std::snprintf(line, sizeof line, "kiln decoder timeline: %lld decode steps, first kernel start to last kernel end median %.4f ms\n",
                      static_cast<long long>(steps_), sorted[sorted.size() / 2] / 1e6);
        std::string out = line;
        out += "  per launch, us: advance = how far it moves the step's end past the previous launch's end; release = its last CTA's wait\n"
               "  returning after that end; after wait = its end after that; span = first CTA start to last CTA end\n";
        std::snprintf(line, sizeof line, "  %-22s %9s %12s %9s %9s %11s %9s\n", "kernel", "per step", "advance/step", "advance", "release", "after wait", "span");
        out += line;
        std::vector<std::pair<double, std::string>> rows;
        for (const auto& [name, t] : totals_) rows.emplace_back(t.advance_ns, name);
        std::sort(rows.rbegin(), rows.rend());
        const double steps = static_cast<double>(steps_);
        for (const auto& [advance, name] : rows) {
            const Totals& t = totals_.at(name);
            std::snprintf(line, sizeof line, "  %-22s %9.1f %12.2f %9.2f %9.2f %11.2f %9.2f\n", name.c_str(), t.launches / steps, advance / steps / 1e3,
                          advance / t.launches / 1e3, t.release_ns / t.launches / 1e3, t.after_wait_ns / t.launches / 1e3, t.span_ns / t.launches / 1e3);
            out += line;
        }
        return out;
    }

    bool on_ = false;
    CtaTraceRecord* records_ = nullptr;
    unsigned* used_ = nullptr;
    int64_t steps_ = 0;
    std::vector<double> step_ns_;
    std::map<std::string, Totals> totals_;
};

}  // namespace kiln::llm::cuda
