// Constant folding: evaluates nodes whose inputs are all constants with the reference
// kernels and stores the results as initializers; Shape of a value whose shape is fully
// known becomes a constant too.
#include <algorithm>

#include "backends/cpu/reference/kernel.h"
#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

// Don't materialize huge broadcasts: a folded output may exceed this only when it is no
// larger than the node's inputs (a Transpose or Cast of a big weight, e.g. a tied LM head).
constexpr int64_t kMaxFoldedElements = 1 << 22;

bool foldable(const Node& n) {
    return n.domain.empty() && n.op_type != "RandomNormal" && n.op_type != "RandomUniform" && n.op_type != "Bernoulli";
}

void foldConstants(Graph& g, const RouteValues& route) {
    const bool fold_values = routeOn(route, "fold.constants"), fold_shapes = routeOn(route, "fold.shapes");
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        Node& n = g.nodes[i];
        if (!foldable(n)) continue;
        std::vector<Tensor> outs;
        int64_t input_elements = 0;
        if (n.op_type == "Shape" && n.hasInput(0) && !constantOf(g, n.inputs[0])) {
            if (!fold_shapes) continue;
            const ValueInfo* vi = g.findValueInfo(n.inputs[0]);
            if (!vi || !vi->shape.fullyKnown()) continue;
            Dims dims = vi->shape.concrete();
            if (numElements(dims) > kMaxFoldedElements) continue;
            // Shape reads only dims: evaluate it on a small stand-in with the right dims.
            Tensor stand_in(DType::U8, dims);
            KernelContext ctx{n, {&stand_in}, g.opset, nullptr};
            outs = referenceKernels().find("Shape")(ctx);
        } else {
            if (!fold_values) continue;
            std::vector<const Tensor*> inputs;
            bool all_const = true;
            for (const auto& in : n.inputs) {
                const Tensor* t = in.empty() ? nullptr : constantOf(g, in);
                all_const &= in.empty() || t != nullptr;
                inputs.push_back(t);
                if (t) input_elements = std::max(input_elements, t->numel());
            }
            if (!all_const) continue;
            KernelFn fn = referenceKernels().find(n.op_type);
            if (!fn) continue;
            try {
                outs = fn(KernelContext{n, inputs, g.opset, nullptr});
            } catch (const Error&) {
                continue;  // leave it for run time, which reports the error with inputs bound
            }
        }
        bool small = true;
        for (const auto& t : outs) small &= t.numel() <= std::max(kMaxFoldedElements, input_elements);
        if (!small || outs.size() < n.outputs.size()) continue;
        for (size_t k = 0; k < n.outputs.size(); ++k)
            if (!n.outputs[k].empty()) g.initializers[n.outputs[k]] = outs[k];
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

}  // namespace

Pass constantFoldingPass() {
    return {"constant_folding",
            {{"fold.constants", {"on", "off"}, "on", "constant_folding", "Evaluate nodes whose inputs are all constant at build time"},
             {"fold.shapes", {"on", "off"}, "on", "constant_folding", "Replace Shape of values with statically known shapes by constants"}},
            foldConstants};
}

}  // namespace kiln
