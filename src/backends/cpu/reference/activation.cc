// Activation functions. Parameters come from attributes with ONNX defaults.
#include <cmath>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// Applies f(x, attrs) elementwise over any float dtype.
template <typename F>
std::vector<Tensor> activation(const KernelContext& ctx, F f) {
    const Tensor& x = ctx.input(0);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return mapElements<T>(x, f);
    })};
}

std::vector<Tensor> relu(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return mapElements<T>(x, [](double v) { return v > 0 ? v : 0.0; });
    })};
}
std::vector<Tensor> sigmoid(const KernelContext& ctx) {
    return activation(ctx, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
}
std::vector<Tensor> tanhKernel(const KernelContext& ctx) {
    return activation(ctx, [](double v) { return std::tanh(v); });
}
std::vector<Tensor> leakyRelu(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 0.01f);
    return activation(ctx, [alpha](double v) { return v >= 0 ? v : alpha * v; });
}
std::vector<Tensor> elu(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 1.0f);
    return activation(ctx, [alpha](double v) { return v >= 0 ? v : alpha * (std::exp(v) - 1); });
}
std::vector<Tensor> selu(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 1.67326319217681884765625f);
    double gamma = ctx.attrs().getFloat("gamma", 1.05070102214813232421875f);
    return activation(ctx, [=](double v) { return v > 0 ? gamma * v : gamma * (alpha * std::exp(v) - alpha); });
}
std::vector<Tensor> celu(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 1.0f);
    return activation(ctx, [=](double v) { return std::max(0.0, v) + std::min(0.0, alpha * (std::exp(v / alpha) - 1)); });
}
std::vector<Tensor> hardSigmoid(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 0.2f);
    double beta = ctx.attrs().getFloat("beta", 0.5f);
    return activation(ctx, [=](double v) { return std::clamp(alpha * v + beta, 0.0, 1.0); });
}
std::vector<Tensor> hardSwish(const KernelContext& ctx) {
    return activation(ctx, [](double v) { return v * std::clamp(v / 6.0 + 0.5, 0.0, 1.0); });
}
std::vector<Tensor> softplus(const KernelContext& ctx) {
    return activation(ctx, [](double v) { return v > 30 ? v : std::log1p(std::exp(v)); });
}
std::vector<Tensor> softsign(const KernelContext& ctx) {
    return activation(ctx, [](double v) { return v / (1.0 + std::fabs(v)); });
}
std::vector<Tensor> thresholdedRelu(const KernelContext& ctx) {
    double alpha = ctx.attrs().getFloat("alpha", 1.0f);
    return activation(ctx, [=](double v) { return v > alpha ? v : 0.0; });
}
std::vector<Tensor> shrink(const KernelContext& ctx) {
    double lambd = ctx.attrs().getFloat("lambd", 0.5f);
    double bias = ctx.attrs().getFloat("bias", 0.0f);
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return mapElements<T>(x, [=](double v) { return v < -lambd ? v + bias : (v > lambd ? v - bias : 0.0); });
    })};
}
// Gelu (opset 20, and the target of GELU pattern fusion): exact erf form or tanh approximation.
std::vector<Tensor> gelu(const KernelContext& ctx) {
    bool tanh_approx = ctx.attrs().getString("approximate", "none") == "tanh";
    return activation(ctx, [=](double v) {
        if (tanh_approx) return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    });
}

std::vector<Tensor> prelu(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor slope = ctx.input(1);
    // Before opset 7 slopes could be unidirectionally broadcast from the channel axis; the
    // common case [C] against [N,C,...] needs trailing ones.
    if (slope.rank() == 1 && x.rank() > 2 && slope.dims()[0] == x.dims()[1] && slope.dims()[0] != x.dims().back()) {
        Dims d(x.rank() - 1, 1);
        d[0] = slope.dims()[0];
        slope = slope.reshaped(d);
    }
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return broadcastBinary<T, T, T>(x, slope, ctx, [](T v, T s) {
            double dv = static_cast<double>(v);
            return static_cast<T>(dv < 0 ? dv * static_cast<double>(s) : dv);
        });
    })};
}

std::vector<Tensor> clip(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        double lo = -std::numeric_limits<double>::infinity();
        double hi = std::numeric_limits<double>::infinity();
        if (ctx.opset < 11) {
            lo = ctx.attrs().getFloat("min", -std::numeric_limits<float>::infinity());
            hi = ctx.attrs().getFloat("max", std::numeric_limits<float>::infinity());
        } else {
            if (const Tensor* t = ctx.optionalInput(1)) lo = t->scalarAt(0);
            if (const Tensor* t = ctx.optionalInput(2)) hi = t->scalarAt(0);
        }
        return mapElements<T>(x, [=](double v) { return std::isnan(v) ? v : std::min(std::max(v, lo), hi); });
    })};
}

}  // namespace

void registerActivationKernels(KernelRegistry& r) {
    r.add("Relu", relu);
    r.add("Sigmoid", sigmoid);
    r.add("Tanh", tanhKernel);
    r.add("LeakyRelu", leakyRelu);
    r.add("Elu", elu);
    r.add("Selu", selu);
    r.add("Celu", celu);
    r.add("HardSigmoid", hardSigmoid);
    r.add("HardSwish", hardSwish);
    r.add("Softplus", softplus);
    r.add("Softsign", softsign);
    r.add("ThresholdedRelu", thresholdedRelu);
    r.add("Shrink", shrink);
    r.add("Gelu", gelu);
    r.add("PRelu", prelu);
    r.add("Clip", clip);
}

}  // namespace kiln
