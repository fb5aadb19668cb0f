#include "backends/cuda/cuda_backend.h"

#include "backends/cpu/graph_executor.h"
#include "backends/cuda/cuda_executor.h"
#include "backends/cuda/cuda_parameters.h"
#include "passes/pass.h"

namespace kiln {

namespace {

class CudaTargetExecutor : public TargetExecutor {
public:
    CudaTargetExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics, const RouteValues& route)
        : graph_(graph), executor_(graph, cuda::CudaOptions{route, tactics, false}) {}
    std::vector<Tensor> run(const TensorMap& inputs, TargetStats& stats) override {
        checkInputs(graph_, inputs);
        auto outputs = executor_.run(inputs);
        const cuda::CudaStats& s = executor_.stats();
        stats.gpu = true;
        stats.arena_bytes = s.arena_bytes;
        stats.unplanned_bytes = s.unplanned_bytes;
        stats.h2d_ms = s.h2d_ms;
        stats.gpu_compute_ms = s.compute_ms;
        stats.d2h_ms = s.d2h_ms;
        stats.graph_replayed = s.graph_replayed;
        stats.weight_bytes = s.weight_bytes;
        stats.scratch_bytes = s.scratch_bytes;
        stats.cpu_nodes = s.cpu_nodes;
        return outputs;
    }

private:
    const Graph& graph_;
    cuda::CudaExecutor executor_;
};

class CudaBackend : public Backend {
public:
    std::string name() const override { return "cuda"; }
    std::string signature() const override { return cuda::deviceSignature(); }
    std::vector<ParameterSpec> parameters() const override { return cuda::cudaParameters(); }
    BuildRoute adjustRoute(const BuildRoute& route, std::vector<std::string>* warnings) const override {
        BuildRoute out = route;
        static const ParameterSpace passes(passParameters());
        for (const char* p : {"precision.conv", "precision.matmul"})
            if (out.get(p) == "int8") {
                out.set(p, "f32", passes);
                if (warnings) warnings->push_back(std::string(p) + "=int8: the cuda target has no int8 kernels yet; the engine keeps its float precision");
            }
        return out;
    }
    // The storage type of every float value (f32 accumulation); no int8 kernels yet.
    std::vector<std::string> precisionParameters(const std::string& precision) const override {
        if (precision == "f16" || precision == "bf16") return {"precision.activations"};
        return {};
    }
    // Timed by running the graph once at the build shapes; with a symbolic dim and no profile
    // there are none, and the executor chooses by heuristics at run time.
    std::map<std::string, std::string> selectTactics(const Graph& graph, const RouteValues& route, TimingCache*,
                                                     const std::map<std::string, Dims>& shapes) const override {
        if (shapes.empty() && !graph.runtimeInputs().empty()) return {};
        return cuda::calibrateTactics(graph, route, shapes);
    }
    std::unique_ptr<TargetExecutor> makeExecutor(const Graph& graph, const std::map<std::string, std::string>& tactics,
                                                 const RouteValues& route) const override {
        return std::make_unique<CudaTargetExecutor>(graph, tactics, route);
    }
};

}  // namespace

const Backend& cudaBackend() {
    static const CudaBackend b;
    return b;
}

}  // namespace kiln
