// The Builder: applies a build route to a model and produces an engine.
#pragma once
#include <filesystem>
#include <memory>

#include "engine/engine.h"
#include "route/build_route.h"

namespace kiln {

class TimingCache;
struct CalibrationTable;

class Builder {
public:
    // `model_hash` identifies the source model in the engine header.
    Builder(Graph model, std::string model_hash, std::string target = "cpu");

    // Every parameter: passes, runtime and hidden debug parameters.
    static const ParameterSpace& space();
    // Values the target cannot honour are set back, each with a warning (Backend::adjustRoute:
    // on the CPU, reduced precisions it would only emulate).
    void setBuildRoute(const BuildRoute& route);
    // What the builder changed or doubts about the route, one line each (the CLI prints them).
    const std::vector<std::string>& warnings() const { return warnings_; }
    const BuildRoute& getBuildRoute() const { return route_; }
    void setShapeProfile(ShapeProfile profile);
    // Activation ranges for routes with precision.conv or precision.matmul=int8 (CPU): the
    // model is quantized to its QDQ form (quant/qdq_insertion.h) before the passes. The table
    // must be for this model (its hash).
    void setCalibration(std::shared_ptr<const CalibrationTable> table) { calibration_ = std::move(table); }
    // Tactic timings are looked up in / added to this cache (not owned; may be null).
    void setTimingCache(TimingCache* cache) { timing_cache_ = cache; }

    // The optimized graph for the current route (what build() lowers).
    Graph optimize() const;
    Engine build() const;

    // Names of the parameters that change this model's optimized graph (or, for runtime
    // parameters, its execution), found by building the graph with each alternative value.
    std::vector<std::string> affectingParameters() const;

    // What decides how an engine runs, as 16 hex digits: its graph and weights, target and
    // profile, and the values of the parameters that act after the passes (tactic choice and
    // run time) where the graph has their ops. Routes that differ only in parameters without
    // effect on the model build engines of one identity, which the tuner measures once. Tactic
    // choices are left out: timed ones differ between identical builds only by noise.
    static std::string engineIdentity(const Engine& engine);

    // The values of a parameter this build takes as themselves: setBuildRoute sets the others
    // back (f16/bf16 on a CPU without native support, int8 off the CPU), so searching them only
    // builds engines that exist already.
    std::vector<std::string> offeredValues(const std::string& parameter) const;

private:
    // The values the passes see: the route plus the target (passes/pass.h kTargetKey).
    RouteValues passRoute(const BuildRoute& r) const;
    // The model the passes start from under route r: quantized where it asks for int8.
    Graph quantized(const BuildRoute& r) const;
    std::map<std::string, Dims> buildShapes(const Engine& e) const;
    Graph model_;
    std::string model_hash_;
    std::string target_;
    ShapeProfile profile_;
    BuildRoute route_;
    TimingCache* timing_cache_ = nullptr;
    std::shared_ptr<const CalibrationTable> calibration_;
    std::vector<std::string> warnings_;
};


// Whether the route asks for int8 products (precision.conv or precision.matmul=int8).
bool int8Requested(const BuildRoute& route);
// quant.skip_first_last: with int8 products, the first and the last stay f32.
const ParameterSpec& quantSkipFirstLastParameter();
// The hidden fault-injection parameter the tuner's isolation tests use.
const ParameterSpec& debugFaultParameter();

}  // namespace kiln
