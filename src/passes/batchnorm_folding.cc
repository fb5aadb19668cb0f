// Folds an inference BatchNormalization into the Conv, ConvTranspose or Gemm that feeds it:
// W' = W * s, b' = (b - mean) * s + beta with s = scale / sqrt(var + eps), per output
// channel. One that cannot fold (after a Concat, as in DenseNet, or first in a block) becomes
// x * s + (beta - mean * s) over per-channel constants: elementwise ops that the chain fusion
// joins with the activation after them, on every target's fast elementwise kernels.
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
        // ConvTranspose weights are [C_in, C_out, k...]: the output channel is axis 1 (one group).
        const bool deconv = prod.op_type == "ConvTranspose" && prod.attrs.getInt("group", 1) == 1;
        if (!conv && !gemm && !deconv) continue;
        if (gemm && (prod.attrs.getInt("transA", 0) != 0 || prod.attrs.getFloat("alpha", 1) != 1.0f || prod.attrs.getFloat("beta", 1) != 1.0f)) continue;
        const Tensor* w = constantOf(g, prod.inputs[1]);
        const Tensor* params[4];
        bool ok = w && w->dtype() == DType::F32;
        for (int k = 0; k < 4 && ok; ++k) ok = (params[k] = constantOf(g, bn.inputs[k + 1])) != nullptr;
        const Tensor* b = prod.hasInput(2) ? constantOf(g, prod.inputs[2]) : nullptr;
        if (!ok || (prod.hasInput(2) && !b)) continue;
        const bool trans_b = gemm && prod.attrs.getInt("transB", 0) != 0;
        if (deconv && w->rank() < 2) continue;
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
            } else {  // column c of a [K, C] GEMM weight, or channel c of each [C_in] row of a deconv's
                const int64_t inner = deconv ? nw.numel() / (nw.dims()[0] * C) : 1;
                for (int64_t r = 0; r < nw.dims()[0]; ++r)
                    for (int64_t k = 0; k < inner; ++k) pw[(r * C + c) * inner + k] = static_cast<float>(pw[(r * C + c) * inner + k] * s);
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

// What is left: x * s + t with s and t of shape [C, 1, ...] (broadcasting over the spatial
// axes of an [N, C, ...] input of known rank).
void batchNormsToAffine(Graph& g) {
    std::vector<bool> erase(g.nodes.size(), false);
    std::vector<Node> added;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const Node& bn = g.nodes[i];
        if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.outputs.size() != 1 || bn.attrs.getInt("training_mode", 0) != 0) continue;
        const ValueInfo* vi = g.findValueInfo(bn.inputs[0]);
        if (!vi || vi->dtype != DType::F32 || !vi->shape.rank_known || vi->shape.dims.size() < 2) continue;
        const Tensor* params[4];
        bool ok = true;
        for (int k = 0; k < 4 && ok; ++k) ok = bn.hasInput(k + 1) && (params[k] = constantOf(g, bn.inputs[k + 1])) != nullptr;
        if (!ok) continue;
        const int64_t C = params[0]->numel();
        for (int k = 1; k < 4; ++k) ok &= params[k]->numel() == C;
        if (!ok) continue;
        Dims dims(vi->shape.dims.size() - 1, 1);
        dims[0] = C;
        Tensor scale(DType::F32, dims), shift(DType::F32, dims);
        const double eps = bn.attrs.getFloat("epsilon", 1e-5f);
        for (int64_t c = 0; c < C; ++c) {
            const double s = params[0]->scalarAt(c) / std::sqrt(params[3]->scalarAt(c) + eps);
            scale.data<float>()[c] = static_cast<float>(s);
            shift.data<float>()[c] = static_cast<float>(params[1]->scalarAt(c) - params[2]->scalarAt(c) * s);
        }
        const std::string sname = freshName(g, bn.name + "_scale"), tname = freshName(g, bn.name + "_shift"), scaled = freshName(g, bn.outputs[0] + "_scaled");
        g.initializers[sname] = scale;
        g.initializers[tname] = shift;
        g.value_info[scaled] = ValueInfo{scaled, DType::F32, vi->shape};
        added.push_back(Node{freshName(g, bn.name + "_mul"), "Mul", "", {bn.inputs[0], sname}, {scaled}, {}});
        added.push_back(Node{freshName(g, bn.name + "_add"), "Add", "", {scaled, tname}, {bn.outputs[0]}, {}});
        erase[i] = true;
    }
    replaceNodes(g, erase, added);
}

}  // namespace

Pass batchNormFoldingPass() {
    return {"batchnorm_folding",
            {{"fusion.batchnorm_fold", {"on", "off"}, "on", "batchnorm_folding", "Fold inference BatchNormalization into the preceding Conv/ConvTranspose/Gemm weights"},
             {"fusion.batchnorm_affine", {"on", "off"}, "on", "batchnorm_folding",
              "Run a BatchNormalization that cannot fold as a per-channel multiply-add (fused with the ops after it)"}},
            [](Graph& g, const RouteValues& route) {
                foldBatchNorms(g, route);
                if (routeOn(route, "fusion.batchnorm_affine")) batchNormsToAffine(g);
            }};
}

}  // namespace kiln
