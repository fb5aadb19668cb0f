// The CUDA executor: runs an optimized graph on the GPU. Weights are uploaded once; for
// each input-shape signature the first run records every value's size and lifetime, then
// one device arena is planned and allocated; later runs write into it and, with
// runtime.cuda_graph=on, replay a captured CUDA graph. Nodes no GPU kernel handles run on
// the CPU reference kernels (their inputs copied to the host), and say so in the stats.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/parameter.h"

namespace kiln::cuda {

// Whether a CUDA device can be used; `why` says what is missing when not.
bool deviceAvailable(std::string* why = nullptr);
// "cuda/sm_90/NVIDIA H200": the target signature engines record. Error without a device.
std::string deviceSignature();

struct CudaOptions {
    RouteValues route;                           // complete route
    std::map<std::string, std::string> tactics;  // node name -> recorded tactic
    bool calibrate = false;                      // time tactic alternatives on the first run
};

struct CudaStats {
    std::string device;
    size_t weight_bytes = 0;   // device memory for weights
    size_t arena_bytes = 0;    // planned activation memory of the last signature
    size_t unplanned_bytes = 0;
    size_t scratch_bytes = 0;  // library workspaces and temporaries
    bool graph_replayed = false;  // the last run replayed a captured CUDA graph
    std::vector<std::string> cpu_nodes;  // nodes that ran on the CPU, with the reason
    double h2d_ms = 0, compute_ms = 0, d2h_ms = 0;  // the last run, by CUDA events
};

class CudaExecutor {
public:
    CudaExecutor(const Graph& graph, CudaOptions options);
    ~CudaExecutor();
    CudaExecutor(const CudaExecutor&) = delete;
    CudaExecutor& operator=(const CudaExecutor&) = delete;
    std::vector<Tensor> run(const std::map<std::string, Tensor>& inputs);
    const CudaStats& stats() const;
    // Tactic per node as the first run chose it ("cpu" for nodes on the CPU).
    const std::map<std::string, std::string>& chosenTactics() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Build-time tactic selection: runs the graph once on seeded random inputs of the given
// shapes with timing of the alternatives, and returns the chosen tactic per node.
std::map<std::string, std::string> calibrateTactics(const Graph& graph, const RouteValues& route, const std::map<std::string, Dims>& shapes);

}  // namespace kiln::cuda
