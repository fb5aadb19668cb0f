// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12/13): class axis 1,
// optional per-class weights, ignore_index, reduction none / sum / mean.
#include <cmath>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// input: [N, C, d...] log-probabilities as double; returns the loss tensor in `dtype`.
Tensor nllLoss(const KernelContext& ctx, const std::vector<double>& input, const Dims& in_dims, const Tensor& target, const Tensor* weight, DType dtype) {
    ctx.require(in_dims.size() >= 2, "input must have rank >= 2");
    const int64_t N = in_dims[0], C = in_dims[1];
    const int64_t inner = numElements(Dims(in_dims.begin() + 2, in_dims.end()));
    const std::string reduction = ctx.attrs().getString("reduction", "mean");
    const bool has_ignore = ctx.attrs().has("ignore_index");
    const int64_t ignore = ctx.attrs().getInt("ignore_index", 0);
    auto labels = target.toInt64Vector();
    ctx.require(static_cast<int64_t>(labels.size()) == N * inner, [&] { return "target " + target.summary() + " does not match input " + dimsToString(in_dims); });
    std::vector<double> loss(labels.size(), 0.0);
    double weight_sum = 0, loss_sum = 0;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t k = n * inner + i;
            const int64_t c = labels[k];
            if (has_ignore && c == ignore) continue;
            ctx.require(c >= 0 && c < C, [&] { return "target class " + std::to_string(c) + " is out of range [0, " + std::to_string(C) + ")"; });
            const double w = weight ? weight->scalarAt(c) : 1.0;
            loss[k] = -input[(n * C + c) * inner + i] * w;
            weight_sum += w;
            loss_sum += loss[k];
        }
    Tensor out;
    dispatchFloat(dtype, ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (reduction == "none") {
            Dims out_dims = {N};
            out_dims.insert(out_dims.end(), in_dims.begin() + 2, in_dims.end());
            out = Tensor(dtype, out_dims);
            for (size_t k = 0; k < loss.size(); ++k) out.data<T>()[k] = static_cast<T>(loss[k]);
        } else {
            ctx.require(reduction == "sum" || reduction == "mean", [&] { return "unknown reduction '" + reduction + "'"; });
            double v = reduction == "sum" ? loss_sum : (weight_sum != 0 ? loss_sum / weight_sum : 0.0);
            out = Tensor::scalar<T>(static_cast<T>(v));
        }
    });
    return out;
}

std::vector<Tensor> negativeLogLikelihood(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {nllLoss(ctx, x.toDoubleVector(), x.dims(), ctx.input(1), ctx.optionalInput(2), x.dtype())};
}

std::vector<Tensor> softmaxCrossEntropy(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 2, "scores must have rank >= 2");
    const int64_t N = x.dims()[0], C = x.dims()[1];
    const int64_t inner = x.numel() / std::max<int64_t>(N * C, 1);
    std::vector<double> logp = x.toDoubleVector();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < inner; ++i) {
            double mx = -INFINITY, sum = 0;
            for (int64_t c = 0; c < C; ++c) mx = std::max(mx, logp[(n * C + c) * inner + i]);
            for (int64_t c = 0; c < C; ++c) sum += std::exp(logp[(n * C + c) * inner + i] - mx);
            for (int64_t c = 0; c < C; ++c) logp[(n * C + c) * inner + i] -= mx + std::log(sum);
        }
    std::vector<Tensor> outs = {nllLoss(ctx, logp, x.dims(), ctx.input(1), ctx.optionalInput(2), x.dtype())};
    if (ctx.numOutputs() > 1) {
        outs.push_back(dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
            using T = typename decltype(tag)::type;
            Tensor lp(x.dtype(), x.dims());
            for (size_t k = 0; k < logp.size(); ++k) lp.data<T>()[k] = static_cast<T>(logp[k]);
            return lp;
        }));
    }
    return outs;
}

}  // namespace

void registerLossKernels(KernelRegistry& r) {
    r.add("NegativeLogLikelihoodLoss", negativeLogLikelihood);
    r.add("SoftmaxCrossEntropyLoss", softmaxCrossEntropy);
}

}  // namespace kiln
