#include "backends/cpu/fast/tactics.h"

#include <omp.h>

#include <set>

extern "C" void openblas_set_num_threads(int);

namespace kiln {

namespace {
int g_threads = 0;
}

const std::vector<Tactic>& fastTactics() {
    static const std::vector<Tactic> tactics = [] {
        std::vector<Tactic> t;
        addGemmTactics(t);
        addBlockedConvTactics(t);
        addDepthwiseConvTactics(t);
        addConvTactics(t);
        addWinogradConvTactics(t);
        addFastOpTactics(t);
        addElementwiseTactics(t);
        addChannelBlockTactics(t);
        addResizeTactics(t);
        addDeconvTactics(t);
        addRecurrentTactics(t);
        addDataTactics(t);
        addReduceTactics(t);
        addQuantizeTactics(t);
        addQuantizedDnnlTactics(t);
        return t;
    }();
    return tactics;
}

std::vector<ParameterSpec> tacticParameters() {
    std::vector<std::string> classes;
    for (const auto& t : fastTactics())
        if (std::find(classes.begin(), classes.end(), t.op_class) == classes.end()) classes.push_back(t.op_class);
    std::vector<ParameterSpec> out;
    for (const auto& cls : classes) {
        ParameterSpec p{"tactic.cpu." + cls, {"auto"}, "auto", "backends/cpu", "Kernel for " + cls + " ops on the CPU: auto times the tactics per node at build time"};
        std::set<std::string> ops;
        for (const auto& t : fastTactics())
            if (t.op_class == cls) {
                if (std::find(p.values.begin(), p.values.end(), t.name) == p.values.end()) p.values.push_back(t.name);
                ops.insert(t.ops.begin(), t.ops.end());
            }
        p.values.push_back("reference");
        std::string list;
        for (const auto& o : ops) list += (list.empty() ? "" : ",") + o;
        p.description += " (" + list + ")";
        p.ops.assign(ops.begin(), ops.end());
        out.push_back(p);
    }
    return out;
}

std::vector<Tensor> referenceFallback(const KernelContext& ctx) { return referenceKernels().find(ctx.node.op_type)(ctx); }

bool supportsAnyNode(const Node&, const Graph&) { return true; }

KernelFn kernelForTactic(const Node& node, const std::string& tactic) {
    if (tactic.empty() || tactic == "reference") return referenceKernels().find(node.op_type);
    for (const auto& t : fastTactics())
        if (t.name == tactic && std::find(t.ops.begin(), t.ops.end(), node.op_type) != t.ops.end()) return t.kernel;
    throw Error(node.describe() + ": unknown tactic '" + tactic + "' for this op (the engine may come from another Kiln build)");
}

void setCpuThreads(int threads) {
    g_threads = threads > 0 ? threads : omp_get_num_procs();
    omp_set_num_threads(g_threads);
    openblas_set_num_threads(g_threads);
}

int cpuThreads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

}  // namespace kiln
