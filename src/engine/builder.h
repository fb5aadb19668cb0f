// The Builder: applies a build route to a model and produces an engine.
#pragma once
#include <filesystem>

#include "engine/engine.h"
#include "route/build_route.h"

namespace kiln {

class TimingCache;

class Builder {
public:
    // `model_hash` identifies the source model in the engine header.
    Builder(Graph model, std::string model_hash, std::string target = "cpu");

    // Every parameter: passes, runtime and hidden debug parameters.
    static const ParameterSpace& space();
    void setBuildRoute(const BuildRoute& route) { route_ = route; }
    const BuildRoute& getBuildRoute() const { return route_; }
    void setShapeProfile(ShapeProfile profile);
    // Tactic timings are looked up in / added to this cache (not owned; may be null).
    void setTimingCache(TimingCache* cache) { timing_cache_ = cache; }

    // The optimized graph for the current route (what build() lowers).
    Graph optimize() const;
    Engine build() const;

    // Names of the parameters that change this model's optimized graph (or, for runtime
    // parameters, its execution), found by building the graph with each alternative value.
    std::vector<std::string> affectingParameters() const;

private:
    // The values the passes see: the route plus the target (passes/pass.h kTargetKey).
    RouteValues passRoute(const BuildRoute& r) const;
    std::map<std::string, std::string> selectCudaTactics(const Engine& e) const;
    std::map<std::string, Dims> buildShapes(const Engine& e) const;
    Graph model_;
    std::string model_hash_;
    std::string target_;
    ShapeProfile profile_;
    BuildRoute route_;
    TimingCache* timing_cache_ = nullptr;
};

// The memory planner parameter, read by the runtime from the engine's route.
const ParameterSpec& memoryPlannerParameter();
// The hidden fault-injection parameter the tuner's isolation tests use.
const ParameterSpec& debugFaultParameter();

}  // namespace kiln
