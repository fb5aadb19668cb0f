// Normalization ops: BatchNormalization (inference), InstanceNormalization,
// LayerNormalization, LRN, MeanVarianceNormalization. Statistics in double.
#include <cmath>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> batchNorm(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(ctx.attrs().getInt("training_mode", 0) == 0, "training_mode=1 is not supported (inference only)");
    ctx.require(x.rank() >= 2, "input must have rank >= 2");
    const int64_t C = x.dims()[1];
    auto scale = ctx.input(1).toDoubleVector(), bias = ctx.input(2).toDoubleVector();
    auto mean = ctx.input(3).toDoubleVector(), var = ctx.input(4).toDoubleVector();
    ctx.require(static_cast<int64_t>(scale.size()) == C && static_cast<int64_t>(bias.size()) == C &&
                    static_cast<int64_t>(mean.size()) == C && static_cast<int64_t>(var.size()) == C,
                [&] { return "scale/bias/mean/var must have " + std::to_string(C) + " elements"; });
    const double eps = ctx.attrs().getFloat("epsilon", 1e-5f);
    const int64_t inner = x.numel() / std::max<int64_t>(x.dims()[0] * C, 1);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            int64_t c = (i / inner) % C;
            po[i] = static_cast<T>((static_cast<double>(px[i]) - mean[c]) / std::sqrt(var[c] + eps) * scale[c] + bias[c]);
        }
        return out;
    })};
}

// Normalizes each of `outer` groups of `inner` contiguous elements; scale/bias indexed by
// affine(i_outer, i_inner). Returns the normalized tensor and per-group mean / inv-std.
template <typename T, typename Affine>
Tensor normalizeGroups(const Tensor& x, int64_t outer, int64_t inner, double eps, Affine affine,
                       std::vector<double>* means = nullptr, std::vector<double>* inv_stds = nullptr) {
    Tensor out(x.dtype(), x.dims());
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t g = 0; g < outer; ++g) {
        double mean = 0, sq = 0;
        for (int64_t i = 0; i < inner; ++i) mean += static_cast<double>(px[g * inner + i]);
        mean /= static_cast<double>(inner);
        for (int64_t i = 0; i < inner; ++i) {
            double d = static_cast<double>(px[g * inner + i]) - mean;
            sq += d * d;
        }
        double inv_std = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
        if (means) means->push_back(mean);
        if (inv_stds) inv_stds->push_back(inv_std);
        for (int64_t i = 0; i < inner; ++i)
            po[g * inner + i] = static_cast<T>(affine(g, i, (static_cast<double>(px[g * inner + i]) - mean) * inv_std));
    }
    return out;
}

std::vector<Tensor> instanceNorm(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 3, "input must have rank >= 3");
    auto scale = ctx.input(1).toDoubleVector(), bias = ctx.input(2).toDoubleVector();
    const int64_t C = x.dims()[1];
    ctx.require(static_cast<int64_t>(scale.size()) == C && static_cast<int64_t>(bias.size()) == C, "scale/bias must have C elements");
    const int64_t inner = x.numel() / std::max<int64_t>(x.dims()[0] * C, 1);
    const double eps = ctx.attrs().getFloat("epsilon", 1e-5f);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return normalizeGroups<T>(x, x.dims()[0] * C, inner, eps, [&](int64_t g, int64_t, double v) { return v * scale[g % C] + bias[g % C]; });
    })};
}

std::vector<Tensor> layerNorm(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", -1), static_cast<int64_t>(x.rank()), ctx);
    const double eps = ctx.attrs().getFloat("epsilon", 1e-5f);
    Dims norm_dims(x.dims().begin() + axis, x.dims().end());
    const int64_t inner = numElements(norm_dims);
    const int64_t outer = inner ? x.numel() / inner : 0;
    const Tensor& scale_t = ctx.input(1);
    auto scale_off = broadcastOffsets(norm_dims, scale_t.dims());
    auto scale = scale_t.toDoubleVector();
    std::vector<double> bias;
    std::vector<int64_t> bias_off;
    if (const Tensor* b = ctx.optionalInput(2)) {
        bias = b->toDoubleVector();
        bias_off = broadcastOffsets(norm_dims, b->dims());
    }
    std::vector<double> means, inv_stds;
    Tensor y = dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return normalizeGroups<T>(x, outer, inner, eps, [&](int64_t, int64_t i, double v) {
            return v * scale[scale_off[i]] + (bias.empty() ? 0.0 : bias[bias_off[i]]);
        }, &means, &inv_stds);
    });
    std::vector<Tensor> outs = {y};
    Dims stat_dims = x.dims();
    for (size_t i = static_cast<size_t>(axis); i < stat_dims.size(); ++i) stat_dims[i] = 1;
    // Mean and InvStdDev use stash_type (f32 by default).
    for (const auto* stats : {&means, &inv_stds}) {
        Tensor t(DType::F32, stat_dims);
        for (size_t i = 0; i < stats->size(); ++i) t.data<float>()[i] = static_cast<float>((*stats)[i]);
        outs.push_back(t);
    }
    outs.resize(std::min<size_t>(outs.size(), ctx.numOutputs()));
    return outs;
}

std::vector<Tensor> lrn(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const double alpha = ctx.attrs().getFloat("alpha", 1e-4f), beta = ctx.attrs().getFloat("beta", 0.75f);
    const double bias = ctx.attrs().getFloat("bias", 1.0f);
    const int64_t size = ctx.attrs().getInt("size");
    const int64_t C = x.dims()[1], inner = x.numel() / std::max<int64_t>(x.dims()[0] * C, 1);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        const int64_t lo_off = (size - 1) / 2, hi_off = (size - 1) - lo_off;  // floor / ceil halves
        for (int64_t n = 0; n < x.dims()[0]; ++n)
            for (int64_t c = 0; c < C; ++c)
                for (int64_t i = 0; i < inner; ++i) {
                    double sq = 0;
                    for (int64_t j = std::max<int64_t>(0, c - lo_off); j <= std::min(C - 1, c + hi_off); ++j) {
                        double v = static_cast<double>(px[(n * C + j) * inner + i]);
                        sq += v * v;
                    }
                    int64_t idx = (n * C + c) * inner + i;
                    po[idx] = static_cast<T>(static_cast<double>(px[idx]) / std::pow(bias + alpha / static_cast<double>(size) * sq, beta));
                }
        return out;
    })};
}

std::vector<Tensor> meanVarianceNorm(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    auto axes = ctx.attrs().getInts("axes", {0, 2, 3});
    std::vector<bool> reduced(x.rank(), false);
    for (int64_t a : axes) reduced[normalizeAxis(a, static_cast<int64_t>(x.rank()), ctx)] = true;
    Dims stat_dims = x.dims();
    for (size_t i = 0; i < x.rank(); ++i)
        if (reduced[i]) stat_dims[i] = 1;
    auto stat_off = broadcastOffsets(x.dims(), stat_dims);
    const int64_t groups = numElements(stat_dims);
    std::vector<double> sum(groups, 0), sq(groups, 0);
    const double count = static_cast<double>(x.numel() / std::max<int64_t>(groups, 1));
    for (int64_t i = 0; i < x.numel(); ++i) sum[stat_off[i]] += x.scalarAt(i);
    for (int64_t i = 0; i < x.numel(); ++i) {
        double d = x.scalarAt(i) - sum[stat_off[i]] / count;
        sq[stat_off[i]] += d * d;
    }
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        for (int64_t i = 0; i < x.numel(); ++i) {
            int64_t g = stat_off[i];
            out.data<T>()[i] = static_cast<T>((x.scalarAt(i) - sum[g] / count) / (std::sqrt(sq[g] / count) + 1e-9));
        }
        return out;
    })};
}

}  // namespace

void registerNormKernels(KernelRegistry& r) {
    r.add("BatchNormalization", batchNorm);
    r.add("InstanceNormalization", instanceNorm);
    r.add("LayerNormalization", layerNorm);
    r.add("LRN", lrn);
    r.add("MeanVarianceNormalization", meanVarianceNorm);
}

}  // namespace kiln
