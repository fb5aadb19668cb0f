// Where the GPU decoder's decode steps spend device time, for tuning the decoder itself.
// KILN_LLM_PROFILE=steps times each decode step on the GPU (CUDA graphs stay on);
// KILN_LLM_PROFILE=stages runs steps eagerly with an event between kernels and sums the
// time per stage name. The report goes to stderr when the model is destroyed.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace kiln::llm::cuda {

class StepProfiler {
public:
    enum class Mode { Off, Steps, Stages };

    StepProfiler() {
        const char* env = std::getenv("KILN_LLM_PROFILE");
        const std::string v = env ? env : "";
        mode_ = v == "stages" ? Mode::Stages : v == "steps" || v == "1" ? Mode::Steps : Mode::Off;
    }
    StepProfiler(const StepProfiler&) = delete;
    StepProfiler& operator=(const StepProfiler&) = delete;
    ~StepProfiler() {
        if (decode_steps_ > 0) std::fputs(report().c_str(), stderr);
        for (cudaEvent_t e : events_) cudaEventDestroy(e);
    }

    Mode mode() const { return mode_; }
    // Stage marks only in Stages mode (they cannot sit inside a graph capture).
    void stage(cudaStream_t s, const char* name) {
        if (mode_ == Mode::Stages) record(s, name);
    }
    void stepBegin(cudaStream_t s) {
        if (mode_ != Mode::Off) used_ = 0, record(s, "upload");
    }
    void stepEnd(cudaStream_t s) {
        if (mode_ != Mode::Off) record(s, "");
    }
    // After the stream synchronized; only decode-only steps are summed.
    void stepDone(bool decode_only) {
        if (mode_ == Mode::Off || used_ < 2 || !decode_only) return;
        float step_ms = 0.f;
        cudaEventElapsedTime(&step_ms, events_[0], events_[used_ - 1]);
        step_ms_.push_back(step_ms);
        for (size_t i = 0; i + 1 < used_; ++i) {
            float ms = 0.f;
            cudaEventElapsedTime(&ms, events_[i], events_[i + 1]);
            totals_[names_[i]] += ms;
        }
        ++decode_steps_;
    }

private:
    void record(cudaStream_t s, const char* name) {
        if (used_ == events_.size()) {
            cudaEvent_t e;
            cudaEventCreate(&e);
            events_.push_back(e);
            names_.emplace_back();
        }
        cudaEventRecord(events_[used_], s);
        names_[used_++] = name;
    }

    std::string report() const {
        std::vector<float> sorted = step_ms_;
        std::sort(sorted.begin(), sorted.end());
        char line[160];
        std::snprintf(line, sizeof line, "kiln decoder profile: %lld decode steps, GPU time per step median %.4f ms (%s)\n",
                      static_cast<long long>(decode_steps_), sorted[sorted.size() / 2], mode_ == Mode::Stages ? "eager, per stage" : "as run");
        std::string out = line;
        std::vector<std::pair<double, std::string>> rows;
        for (const auto& [name, ms] : totals_) rows.emplace_back(ms, name);
        std::sort(rows.rbegin(), rows.rend());
        for (const auto& [ms, name] : rows) {
            std::snprintf(line, sizeof line, "  %-20s %9.4f ms/step\n", name.c_str(), ms / static_cast<double>(decode_steps_));
            out += line;
        }
        return out;
    }

    Mode mode_ = Mode::Off;
    std::vector<cudaEvent_t> events_;
    std::vector<std::string> names_;
    size_t used_ = 0;
    int64_t decode_steps_ = 0;
    std::vector<float> step_ms_;
    std::map<std::string, double> totals_;
};

}  // namespace kiln::llm::cuda
