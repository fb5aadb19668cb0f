// Kernel coverage of a built engine: which nodes run on a slow path, and why. On the CPU a
// slow path is a reference kernel (a plain loop kept for correctness), in subgraphs too; shape and view ops,
// whose reference kernels do no arithmetic, are left out. Build, inspect and bench report it
// so that a model with missing fast kernels shows itself before anyone profiles it.
#pragma once
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kiln {

struct SlowNode {
    std::string node, op, why;
};

// A CPU engine's nodes that run on reference kernels although they compute; empty for other
// targets (a CUDA engine's host fallbacks are found when it runs: ContextStats::cpu_nodes).
std::vector<SlowNode> referenceKernelNodes(const Engine& engine);

// "N of M nodes on reference kernels (Op xK, ...)", or "" when there are none.
std::string coverageSummary(const Engine& engine, const std::vector<SlowNode>& slow);

}  // namespace kiln
