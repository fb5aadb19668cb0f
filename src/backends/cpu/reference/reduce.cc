// Reductions (Reduce*), ArgMax/ArgMin, TopK and CumSum. Accumulation in double.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class Reduce { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

template <Reduce Op>
std::vector<Tensor> reduce(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    // Axes moved from attribute to input in opset 13 (ReduceSum) and 18 (the rest).
    std::vector<int64_t> axes = intsFromInputOrAttr(ctx, 1, "axes");
    const bool keepdims = ctx.attrs().getInt("keepdims", 1) != 0;
    if (axes.empty() && ctx.attrs().getInt("noop_with_empty_axes", 0) != 0) return {x};
    std::vector<bool> reduced(x.rank(), axes.empty());
    for (int64_t a : axes) reduced[normalizeAxis(a, rank, ctx)] = true;
    Dims kept_dims = x.dims(), out_dims;
    for (int64_t i = 0; i < rank; ++i) {
        if (reduced[i]) kept_dims[i] = 1;
        if (!reduced[i] || keepdims) out_dims.push_back(kept_dims[i]);
    }
    auto target = broadcastOffsets(x.dims(), kept_dims);
    const int64_t groups = numElements(kept_dims);
    double init = 0;
    if (Op == Reduce::Max) init = -INFINITY;
    if (Op == Reduce::Min) init = INFINITY;
    if (Op == Reduce::Prod) init = 1;
    std::vector<double> acc(static_cast<size_t>(groups), init);
    std::vector<double> mx(static_cast<size_t>(groups), -INFINITY);
    if (Op == Reduce::LogSumExp)
        for (int64_t i = 0; i < x.numel(); ++i) mx[target[i]] = std::max(mx[target[i]], x.scalarAt(i));
    for (int64_t i = 0; i < x.numel(); ++i) {
        double v = x.scalarAt(i);
        double& a = acc[target[i]];
        switch (Op) {
            case Reduce::Sum:
            case Reduce::Mean:
            case Reduce::LogSum: a += v; break;
            case Reduce::Max: a = std::isnan(v) ? v : std::max(a, v); break;
            case Reduce::Min: a = std::isnan(v) ? v : std::min(a, v); break;
            case Reduce::Prod: a *= v; break;
            case Reduce::L1: a += std::fabs(v); break;
            case Reduce::L2:
            case Reduce::SumSquare: a += v * v; break;
            case Reduce::LogSumExp: a += std::exp(v - mx[target[i]]); break;
        }
    }
    const double count = groups ? static_cast<double>(x.numel()) / static_cast<double>(groups) : 0;
    for (int64_t g = 0; g < groups; ++g) {
        double& a = acc[g];
        if (Op == Reduce::Mean) a /= count;
        if (Op == Reduce::L2) a = std::sqrt(a);
        if (Op == Reduce::LogSum) a = std::log(a);
        if (Op == Reduce::LogSumExp) a = std::log(a) + mx[g];
    }
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        for (int64_t g = 0; g < groups; ++g) out.data<T>()[g] = static_cast<T>(acc[g]);
        return out;
    })};
}

template <bool IsMax>
std::vector<Tensor> argExtreme(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), rank, ctx);
    const bool keepdims = ctx.attrs().getInt("keepdims", 1) != 0;
    const bool last = ctx.attrs().getInt("select_last_index", 0) != 0;
    int64_t outer = 1, len = x.dims()[axis], inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dims()[i];
    for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims()[i];
    Dims out_dims;
    for (int64_t i = 0; i < rank; ++i)
        if (i != axis) out_dims.push_back(x.dims()[i]);
        else if (keepdims) out_dims.push_back(1);
    Tensor out(DType::I64, out_dims);
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t in = 0; in < inner; ++in) {
            int64_t best = 0;
            double bv = x.scalarAt(o * len * inner + in);
            for (int64_t j = 1; j < len; ++j) {
                double v = x.scalarAt((o * len + j) * inner + in);
                bool better = IsMax ? (v > bv || (last && v == bv)) : (v < bv || (last && v == bv));
                if (better) {
                    bv = v;
                    best = j;
                }
            }
            out.data<int64_t>()[o * inner + in] = best;
        }
    return {out};
}

std::vector<Tensor> topK(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", -1), rank, ctx);
    const int64_t k = ctx.hasInput(1) ? ctx.input(1).toInt64Vector().at(0) : ctx.attrs().getInt("k");
    const bool largest = ctx.attrs().getInt("largest", 1) != 0;
    const int64_t len = x.dims()[axis];
    ctx.require(k >= 0 && k <= len, [&] { return "k=" + std::to_string(k) + " is out of range for axis of size " + std::to_string(len); });
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dims()[i];
    for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims()[i];
    Dims out_dims = x.dims();
    out_dims[axis] = k;
    Tensor indices(DType::I64, out_dims);
    Tensor values = dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        std::vector<int64_t> order(static_cast<size_t>(len));
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t in = 0; in < inner; ++in) {
                auto at = [&](int64_t j) { return static_cast<double>(px[(o * len + j) * inner + in]); };
                std::iota(order.begin(), order.end(), 0);
                // Ties keep the lower index first, as ONNX requires.
                std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return largest ? at(a) > at(b) : at(a) < at(b); });
                for (int64_t j = 0; j < k; ++j) {
                    int64_t dst = (o * k + j) * inner + in;
                    out.data<T>()[dst] = px[(o * len + order[j]) * inner + in];
                    indices.data<int64_t>()[dst] = order[j];
                }
            }
        return out;
    });
    return {values, indices};
}

std::vector<Tensor> cumSum(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const int64_t axis = normalizeAxis(ctx.input(1).toInt64Vector().at(0), rank, ctx);
    const bool exclusive = ctx.attrs().getInt("exclusive", 0) != 0;
    const bool reverse = ctx.attrs().getInt("reverse", 0) != 0;
    int64_t outer = 1, len = x.dims()[axis], inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dims()[i];
    for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims()[i];
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t in = 0; in < inner; ++in) {
                double acc = 0;
                for (int64_t step = 0; step < len; ++step) {
                    int64_t j = reverse ? len - 1 - step : step;
                    int64_t idx = (o * len + j) * inner + in;
                    double v = static_cast<double>(px[idx]);
                    if (!exclusive) acc += v;
                    out.data<T>()[idx] = static_cast<T>(acc);
                    if (exclusive) acc += v;
                }
            }
        return out;
    })};
}

}  // namespace

void registerReduceKernels(KernelRegistry& r) {
    r.add("ReduceSum", reduce<Reduce::Sum>);
    r.add("ReduceMean", reduce<Reduce::Mean>);
    r.add("ReduceMax", reduce<Reduce::Max>);
    r.add("ReduceMin", reduce<Reduce::Min>);
    r.add("ReduceProd", reduce<Reduce::Prod>);
    r.add("ReduceL1", reduce<Reduce::L1>);
    r.add("ReduceL2", reduce<Reduce::L2>);
    r.add("ReduceLogSum", reduce<Reduce::LogSum>);
    r.add("ReduceLogSumExp", reduce<Reduce::LogSumExp>);
    r.add("ReduceSumSquare", reduce<Reduce::SumSquare>);
    r.add("ArgMax", argExtreme<true>);
    r.add("ArgMin", argExtreme<false>);
    r.add("TopK", topK);
    r.add("CumSum", cumSum);
}

}  // namespace kiln
