// An execution context: runs one engine with its own activation arena. Several contexts
// may share one engine across threads.
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "runtime/executor.h"
#include "runtime/memory_plan.h"

#pragma once

namespace kiln {

namespace cuda {
class CudaExecutor;
}

struct ContextStats {
    size_t arena_bytes = 0;      // planned activation memory for the last input shapes
    size_t unplanned_bytes = 0;  // what the same activations take without reuse
    std::string planner;
    // CUDA engines: the last run's phases by device events, and where nodes ran.
    bool gpu = false;
    double h2d_ms = 0, gpu_compute_ms = 0, d2h_ms = 0;
    bool graph_replayed = false;
    size_t weight_bytes = 0, scratch_bytes = 0;
    std::vector<std::string> cpu_nodes;  // nodes of a CUDA engine that ran on the CPU, with why
};

class ExecutionContext {
public:
    explicit ExecutionContext(const Engine& engine);
    ~ExecutionContext();
    // Checks inputs against the graph and the engine's shape profile, then runs.
    std::vector<Tensor> run(const TensorMap& inputs);
    const ContextStats& stats() const { return stats_; }

private:
    struct Arena;
    const Engine& engine_;
    std::unique_ptr<GraphExecutor> executor_;       // CPU engines
    std::unique_ptr<cuda::CudaExecutor> cuda_;      // CUDA engines
    std::string planner_;
    std::map<std::string, std::unique_ptr<Arena>> arenas_;  // per input-shape signature
    Arena* last_arena_ = nullptr;                             // the last run's, and its inputs:
    std::vector<std::tuple<std::string, DType, Dims>> last_inputs_;
    ContextStats stats_;
};

}  // namespace kiln
