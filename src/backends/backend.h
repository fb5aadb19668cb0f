// One compilation target behind one interface. The engine, the engine file, the runtime and
// the tools reach a target only through a Backend from the registry (backends/registry.cc):
// adding a target is a folder under backends/ and one line there.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/parameter.h"
#include "route/build_route.h"

namespace kiln {

class TimingCache;
using TensorMap = std::map<std::string, Tensor>;

// What an executor reports of its last run.
struct TargetStats {
    size_t arena_bytes = 0;      // planned activation memory for the last input shapes
    size_t unplanned_bytes = 0;  // what the same activations take without reuse
    std::string planner;
    // GPU targets: the last run's phases by device events, and where nodes ran.
    bool gpu = false;
    double h2d_ms = 0, gpu_compute_ms = 0, d2h_ms = 0;
    bool graph_replayed = false;
    size_t weight_bytes = 0, scratch_bytes = 0;
    std::vector<std::string> cpu_nodes;  // nodes that fell back to the host, with why
};

// Runs one engine's graph on its target, with memory of its own.
class TargetExecutor {
public:
    virtual ~TargetExecutor() = default;
    // Checks the inputs against the graph (checkInputs), then runs; `stats` gets the run's figures.
    virtual std::vector<Tensor> run(const TensorMap& inputs, TargetStats& stats) = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    // The kind users name ("cpu"), and the owner of its parameters ("backends/cpu").
    virtual std::string name() const = 0;
    // The signature engines record and loading compares ("cpu/x86_64/generic"); an Error
    // when the target cannot run here (no GPU).
    virtual std::string signature() const = 0;
    // Its own parameters (tactics, run-time settings); they join the space of every build.
    virtual std::vector<ParameterSpec> parameters() const = 0;
    // The route a build on this target takes: values it cannot honour are set back, each with
    // a warning (a precision it would only emulate, int8 where it has no int8 kernels).
    virtual BuildRoute adjustRoute(const BuildRoute& route, std::vector<std::string>* warnings) const = 0;
    // The parameters a precision flag (--fp16, --bf16, --int8) sets to that precision on this
    // target; empty when the target has no such precision.
    virtual std::vector<std::string> precisionParameters(const std::string& precision) const = 0;
    // The tactic per node of an optimized graph. `shapes`: every runtime input's build shape
    // (the profile's opt), empty when some is unknown; `cache` may be null.
    virtual std::map<std::string, std::string> selectTactics(const Graph& graph, const RouteValues& route, TimingCache* cache,
                                                             const std::map<std::string, Dims>& shapes) const = 0;
    // An executor of an engine's graph (kept alive by the caller) with its tactics and route.
    virtual std::unique_ptr<TargetExecutor> makeExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics,
                                                         const RouteValues& route) const = 0;
};

// The backend of a kind ("cpu") or of a signature ("cuda/sm_90/..."); an Error naming the
// known kinds for any other. Never touches a device.
const Backend& backendFor(const std::string& target);
// Every registered kind, in registry order.
std::vector<std::string> backendNames();
// The same for help texts: "cpu, cuda or reference".
std::string backendNamesText();
// Every backend's parameters, in registry order.
std::vector<ParameterSpec> backendParameters();

}  // namespace kiln
