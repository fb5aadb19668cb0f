// Folds an inference BatchNormalization into the Conv or Gemm that feeds it:
// W' = W * s, b' = (b - mean) * s + beta with s = scale / sqrt(var + eps), per channel.
#include <cmath>

#include "passes/graph_rewrite.h"
#include "passes/pass.h"

namespace kiln {

namespace {

void foldBatchNorms(Graph& g, const RouteValues& route) {
    if (!routeOn(route, "fusion.batchnorm_fold")) return;
    GraphIndex index(g);
    std::vector<bool> erase(g.nodes.size(), false);
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& bn = g.nodes[i];
        if (bn.op_type != "BatchNormalization" || bn.outputs.size() != 1 || bn.attrs.getInt("training_mode", 0) != 0) continue;
        const int p = index.producer(bn.inputs[0]);
        if (p < 0 || !index.singleUse(bn.inputs[0])) continue;
        Node& prod = g.nodes[p];
        const bool conv = prod.op_type == "Conv", gemm = prod.op_type == "Gemm";
        if (!conv && !gemm) continue;
        if (gemm && (prod.attrs.getInt("transA", 0) != 0 || prod.attrs.getFloat("alpha", 1) != 1.0f || prod.attrs.getFloat("beta", 1) != 1.0f)) continue;
        const Tensor* w = constantOf(g, prod.inputs[1]);
        const Tensor* params[4];
        bool ok = w && w->dtype() == DType::F32;
        for (int k = 0; k < 4 && ok; ++k) ok = (params[k] = constantOf(g, bn.inputs[k + 1])) != nullptr;
        const Tensor* b = prod.hasInput(2) ? constantOf(g, prod.inputs[2]) : nullptr;
        if (!ok || (prod.hasInput(2) && !b)) continue;
        const bool trans_b = gemm && prod.attrs.getInt("transB", 0) != 0;
        const int64_t C = conv ? w->dims()[0] : (trans_b ? w->dims()[0] : w->dims()[1]);
        auto scale = params[0]->toDoubleVector(), beta = params[1]->toDoubleVector(), mean = params[2]->toDoubleVector(), var = params[3]->toDoubleVector();
        if (static_cast<int64_t>(scale.size()) != C || (b && b->numel() != C)) continue;
        const double eps = bn.attrs.getFloat("epsilon", 1e-5f);
        Tensor nw = w->clone();
        Tensor nb(DType::F32, {C});
        float* pw = nw.data<float>();
        for (int64_t c = 0; c < C; ++c) {
            const double s = scale[c] / std::sqrt(var[c] + eps);
            nb.data<float>()[c] = static_cast<float>(((b ? b->scalarAt(c) : 0.0) - mean[c]) * s + beta[c]);
            if (conv || trans_b) {
                const int64_t per = nw.numel() / C;
                for (int64_t k = 0; k < per; ++k) pw[c * per + k] = static_cast<float>(pw[c * per + k] * s);
            } else {
                for (int64_t r = 0; r < nw.dims()[0]; ++r) pw[r * C + c] = static_cast<float>(pw[r * C + c] * s);
            }
        }
        const std::string wname = freshName(g, prod.inputs[1] + "_bnfold"), bname = freshName(g, prod.outputs[0] + "_bnfold_bias");
        g.initializers[wname] = nw;
        g.initializers[bname] = nb;
        prod.inputs.resize(3);
        prod.inputs[1] = wname;
        prod.inputs[2] = bname;
        prod.outputs[0] = bn.outputs[0];
        erase[i] = true;
    }
    eraseNodes(g, erase);
}

}  // namespace

Pass batchNormFoldingPass() {
    return {"batchnorm_folding",
            {{"fusion.batchnorm_fold", {"on", "off"}, "on", "batchnorm_folding", "Fold inference BatchNormalization into the preceding Conv/Gemm weights"}},
            foldBatchNorms};
}

}  // namespace kiln
