// The fast CPU backend: alternative implementations (tactics) of the ops that dominate
// real models. Each tactic says which nodes it supports; the Builder picks one per node
// from the route's tactic parameters (or times them, with "auto") and records it in the
// engine. Every node can always fall back to the "reference" tactic.
#pragma once
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/reference/kernel.h"
#include "ir/parameter.h"

namespace kiln {

struct Tactic {
    std::string name;        // e.g. "blas", "im2col", "depthwise"
    std::string op_class;    // the route parameter group: "gemm", "conv", "norm", ...
    std::vector<std::string> ops;
    // Whether it handles this node (types, attributes) given its input types.
    bool (*supports)(const Node& node, const Graph& graph);
    KernelFn kernel;
};

// Every fast tactic, in preference order within a class.
const std::vector<Tactic>& fastTactics();
// The parameters choosing tactics per op class: tactic.cpu.<class> = auto|<tactics>|reference.
std::vector<ParameterSpec> tacticParameters();
// The node's reference kernel: what a fast tactic runs on inputs it does not cover.
std::vector<Tensor> referenceFallback(const KernelContext& ctx);
// Tactic::supports of tactics that take every node of their ops.
bool supportsAnyNode(const Node& n, const Graph& g);

// The kernel for a node's recorded tactic ("reference" or a fast tactic name).
KernelFn kernelForTactic(const Node& node, const std::string& tactic);

// Sets the number of threads the fast kernels (and BLAS) use; 0 = all cores.
void setCpuThreads(int threads);
int cpuThreads();

// Registration of each kernel file's tactics (listed in tactics.cc).
void addGemmTactics(std::vector<Tactic>& t);
void addBlockedConvTactics(std::vector<Tactic>& t);
void addDepthwiseConvTactics(std::vector<Tactic>& t);
void addConvTactics(std::vector<Tactic>& t);
void addWinogradConvTactics(std::vector<Tactic>& t);
void addFastOpTactics(std::vector<Tactic>& t);
void addElementwiseTactics(std::vector<Tactic>& t);
void addChannelBlockTactics(std::vector<Tactic>& t);
void addResizeTactics(std::vector<Tactic>& t);
void addDeconvTactics(std::vector<Tactic>& t);
void addRecurrentTactics(std::vector<Tactic>& t);
void addDataTactics(std::vector<Tactic>& t);
void addReduceTactics(std::vector<Tactic>& t);
void addQuantizeTactics(std::vector<Tactic>& t);
void addQuantizedDnnlTactics(std::vector<Tactic>& t);

}  // namespace kiln
