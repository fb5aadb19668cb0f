// An execution context: runs one engine with its own activation arena. Several contexts
// may share one engine across threads.
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/graph_executor.h"
#include "engine/engine.h"

#pragma once

namespace kiln {

using ContextStats = TargetStats;

class ExecutionContext {
public:
    explicit ExecutionContext(const Engine& engine);
    ~ExecutionContext();
    // Checks inputs against the graph and the engine's shape profile, then runs.
    std::vector<Tensor> run(const TensorMap& inputs);
    const ContextStats& stats() const { return stats_; }

private:
    const Engine& engine_;
    std::unique_ptr<TargetExecutor> executor_;  // of the engine's target
    ContextStats stats_;
};

}  // namespace kiln
