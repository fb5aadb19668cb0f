#include "backends/reference/reference_backend.h"

#include "backends/cpu/graph_executor.h"

namespace kiln {

namespace {

class ReferenceExecutor : public TargetExecutor {
public:
    explicit ReferenceExecutor(const Graph& graph) : executor_(graph) {}
    std::vector<Tensor> run(const TensorMap& inputs, TargetStats& stats) override {
        stats.planner = "none";
        return executor_.run(inputs);  // checks the inputs
    }

private:
    GraphExecutor executor_;  // no tactics: reference kernels throughout
};

class ReferenceBackend : public Backend {
public:
    std::string name() const override { return "reference"; }
    std::string signature() const override { return "reference/any"; }
    std::vector<ParameterSpec> parameters() const override { return {}; }
    // The route's precisions are honoured as written (emulated where the CPU lacks them):
    // this target shows what a route computes, not how fast.
    BuildRoute adjustRoute(const BuildRoute& route, std::vector<std::string>*) const override { return route; }
    std::vector<std::string> precisionParameters(const std::string&) const override { return {}; }
    std::map<std::string, std::string> selectTactics(const Graph&, const RouteValues&, TimingCache*, const std::map<std::string, Dims>&) const override {
        return {};
    }
    std::unique_ptr<TargetExecutor> makeExecutor(const Graph& graph, const std::map<std::string, std::string>&, const RouteValues&) const override {
        return std::make_unique<ReferenceExecutor>(graph);
    }
};

}  // namespace

const Backend& referenceBackend() {
    static const ReferenceBackend b;
    return b;
}

}  // namespace kiln
