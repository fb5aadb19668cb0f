#include "runtime/context.h"

#include "backends/memory_plan.h"

namespace kiln {

ExecutionContext::ExecutionContext(const Engine& engine) : engine_(engine) {
    // The values the executor reads: the target's parameters and the memory planner, as the
    // engine's route sets them, else (an engine from before a parameter existed) defaults.
    const Backend& backend = backendFor(engine.target);
    RouteValues route;
    for (const auto& p : backend.parameters()) route[p.name] = p.default_value;
    route[memoryPlannerParameter().name] = memoryPlannerParameter().default_value;
    for (size_t start = 0; start < engine.route.size();) {
        size_t end = engine.route.find(';', start);
        if (end == std::string::npos) end = engine.route.size();
        const std::string item = engine.route.substr(start, end - start);
        if (const size_t eq = item.find('='); eq != std::string::npos) route[item.substr(0, eq)] = item.substr(eq + 1);
        start = end + 1;
    }
    executor_ = backend.makeExecutor(engine.graph, engine.tactics, route);
}

ExecutionContext::~ExecutionContext() = default;

std::vector<Tensor> ExecutionContext::run(const TensorMap& inputs) {
    for (const auto& [name, range] : engine_.profile) {
        auto it = inputs.find(name);
        if (it == inputs.end()) continue;  // checkInputs reports it
        const Dims& d = it->second.dims();
        check(range.contains(d), [&] {
            return "input '" + name + "' has shape " + dimsToString(d) + ", outside the engine's profile " + dimsToString(range.min) + " .. " +
                   dimsToString(range.max);
        });
    }
    return executor_->run(inputs, stats_);
}

}  // namespace kiln
