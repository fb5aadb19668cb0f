#include "backends/cpu/reference/kernel_util.h"

#include <algorithm>

namespace kiln {

SliceRange sliceRange(int64_t start, int64_t end, int64_t step, int64_t dim) {
    if (dim == 0) return {};
    int64_t b = start < 0 ? start + dim : start;
    int64_t e = end < 0 ? end + dim : end;
    if (step > 0) {
        b = std::clamp<int64_t>(b, 0, dim);
        e = std::clamp<int64_t>(e, 0, dim);
        return {b, e > b ? (e - b + step - 1) / step : 0};
    }
    b = std::clamp<int64_t>(b, 0, dim - 1);
    e = std::clamp<int64_t>(e, -1, dim - 1);
    return {b, b > e ? (b - e - step - 1) / (-step) : 0};
}

int64_t normalizeAxis(int64_t axis, int64_t rank, const KernelContext& ctx) {
    int64_t a = axis < 0 ? axis + rank : axis;
    ctx.require(a >= 0 && a < rank, [&] { return "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank); });
    return a;
}

std::vector<int64_t> broadcastOffsets(const Dims& out_dims, const Dims& in_dims) {
    const BroadcastRuns runs(out_dims, {in_dims});  // checks that in_dims broadcasts, as every caller relies on
    std::vector<int64_t> offsets(static_cast<size_t>(numElements(out_dims)));
    const int64_t len = runs.length(), step = runs.step(0);
    runs.forEach([&](int64_t o, const int64_t* in) {
        for (int64_t j = 0; j < len; ++j) offsets[static_cast<size_t>(o + j)] = in[0] + j * step;
    });
    return offsets;
}

BroadcastRuns::BroadcastRuns(const Dims& out_dims, const std::vector<Dims>& in_dims) {
    const size_t rank = out_dims.size(), inputs = in_dims.size();
    for (int64_t d : out_dims) check(d >= 0, [&] { return "negative dimension in " + dimsToString(out_dims); });
    std::vector<Dims> full(inputs, Dims(rank, 0));  // per input, its stride along each output dim
    for (size_t k = 0; k < inputs; ++k) {
        const Dims& in = in_dims[k];
        check(in.size() <= rank, [&] { return "cannot broadcast " + dimsToString(in) + " to " + dimsToString(out_dims); });
        int64_t step = 1;
        for (size_t i = in.size(); i-- > 0;) {
            const int64_t d = in[i], out = out_dims[rank - in.size() + i];
            check(d == out || d == 1, [&] { return "cannot broadcast " + dimsToString(in) + " to " + dimsToString(out_dims); });
            full[k][rank - in.size() + i] = d == 1 ? 0 : step;
            step *= d;
        }
    }
    // Coalesce: a dim joins the one before it where every input steps through both as one
    // run; size-1 dims move nothing. [N,C,H,W] * [N,C,1,1] becomes runs of H*W.
    Dims dims;
    std::vector<Dims> strides(inputs);
    for (size_t i = 0; i < rank; ++i) {
        if (out_dims[i] == 0) {
            length_ = 0;
            steps_.assign(inputs, 0);
            strides_.assign(inputs, Dims{});
            return;
        }
        if (out_dims[i] == 1) continue;
        bool joins = !dims.empty();
        for (size_t k = 0; k < inputs && joins; ++k) joins = strides[k].back() == full[k][i] * out_dims[i];
        if (joins) {
            dims.back() *= out_dims[i];
            for (size_t k = 0; k < inputs; ++k) strides[k].back() = full[k][i];
        } else {
            dims.push_back(out_dims[i]);
            for (size_t k = 0; k < inputs; ++k) strides[k].push_back(full[k][i]);
        }
    }
    steps_.assign(inputs, 0);
    if (!dims.empty()) {
        length_ = dims.back();
        outer_.assign(dims.begin(), dims.end() - 1);
        for (size_t k = 0; k < inputs; ++k) {
            steps_[k] = strides[k].back();
            strides[k].pop_back();
        }
    }
    strides_ = std::move(strides);
    for (int64_t d : outer_) runs_ *= d;
}

int64_t BroadcastRuns::offset(size_t k, int64_t run) const {
    int64_t off = 0;
    for (size_t i = outer_.size(); i-- > 0;) {
        off += (run % outer_[i]) * strides_[k][i];
        run /= outer_[i];
    }
    return off;
}

Tensor legacyBroadcastOperand(const Tensor& a, const Tensor& b, const KernelContext& ctx) {
    if (ctx.opset >= 7 || ctx.attrs().getInt("broadcast", 0) == 0 || !ctx.attrs().has("axis")) return b;
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis"), static_cast<int64_t>(a.rank()), ctx);
    const int64_t trailing = static_cast<int64_t>(a.rank()) - axis - static_cast<int64_t>(b.rank());
    ctx.require(trailing >= 0, [&] { return "legacy broadcast of " + b.summary() + " at axis " + std::to_string(axis) + " does not fit " + a.summary(); });
    Dims d = b.dims();
    d.insert(d.end(), static_cast<size_t>(trailing), 1);
    return b.reshaped(d);
}

std::function<double(double)> unaryFunction(const std::string& name, float p0, float p1, const KernelContext& ctx) {
    const double a = p0, b = p1;
    if (name == "Relu") return [](double v) { return v > 0 ? v : 0.0; };
    if (name == "Sigmoid") return [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
    if (name == "Silu") return [](double v) { return v / (1.0 + std::exp(-v)); };  // x * sigmoid(x), fused by the passes
    if (name == "Tanh") return [](double v) { return std::tanh(v); };
    if (name == "LeakyRelu") return [a](double v) { return v >= 0 ? v : a * v; };
    if (name == "Clip") return [a, b](double v) { return std::isnan(v) ? v : std::min(std::max(v, a), b); };
    if (name == "HardSigmoid") return [a, b](double v) { return std::clamp(a * v + b, 0.0, 1.0); };
    if (name == "HardSwish") return [](double v) { return v * std::clamp(v / 6.0 + 0.5, 0.0, 1.0); };
    if (name == "Gelu") return [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
    if (name == "GeluTanh") return [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v))); };
    if (name == "Softplus") return [](double v) { return v > 30 ? v : std::log1p(std::exp(v)); };
    if (name == "Exp") return [](double v) { return std::exp(v); };
    if (name == "Log") return [](double v) { return std::log(v); };
    if (name == "Sqrt") return [](double v) { return std::sqrt(v); };
    if (name == "Neg") return [](double v) { return -v; };
    if (name == "Abs") return [](double v) { return std::fabs(v); };
    if (name == "Erf") return [](double v) { return std::erf(v); };
    if (name == "Reciprocal") return [](double v) { return 1.0 / v; };
    if (name == "none" || name.empty()) return [](double v) { return v; };
    ctx.fail("unknown fused activation '" + name + "'");
}

Tensor tensorFromDoubles(DType t, const Dims& dims, const std::vector<double>& values, const KernelContext& ctx) {
    Tensor out = Tensor::uninitialized(t, dims);
    dispatchNumeric(t, ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* p = out.data<T>();
        for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
    });
    return out;
}

std::vector<int64_t> intsFromInputOrAttr(const KernelContext& ctx, size_t input, const std::string& attr) {
    if (const Tensor* t = ctx.optionalInput(input)) return t->toInt64Vector();
    return ctx.attrs().getInts(attr);
}

Dims poolOutputSpatial(const KernelContext& ctx, const Dims& in_spatial, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                       const std::vector<int64_t>& dilations, const SpatialPads& pads) {
    const bool ceil_mode = ctx.attrs().getInt("ceil_mode", 0) != 0;
    const std::string auto_pad = ctx.attrs().getString("auto_pad", "NOTSET");
    Dims out(in_spatial.size());
    for (size_t i = 0; i < in_spatial.size(); ++i) {
        const int64_t eff = (kernel[i] - 1) * dilations[i] + 1;
        if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
            out[i] = (in_spatial[i] + strides[i] - 1) / strides[i];
        } else {
            const int64_t span = in_spatial[i] + pads.begin[i] + pads.end[i] - eff;
            out[i] = (ceil_mode ? (span + strides[i] - 1) / strides[i] : span / strides[i]) + 1;
            // A window must start inside the input or the leading padding.
            if (ceil_mode && (out[i] - 1) * strides[i] >= in_spatial[i] + pads.begin[i]) --out[i];
        }
        ctx.require(out[i] > 0, "kernel larger than padded input");
    }
    return out;
}

SpatialPads resolvePads(const KernelContext& ctx, const Dims& in_spatial, const std::vector<int64_t>& kernel,
                        const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations) {
    const size_t n = in_spatial.size();
    SpatialPads p{std::vector<int64_t>(n, 0), std::vector<int64_t>(n, 0)};
    std::string auto_pad = ctx.attrs().getString("auto_pad", "NOTSET");
    if (auto_pad == "NOTSET") {
        auto pads = ctx.attrs().getInts("pads", std::vector<int64_t>(2 * n, 0));
        ctx.require(pads.size() == 2 * n, [&] { return "pads must have " + std::to_string(2 * n) + " values"; });
        for (size_t i = 0; i < n; ++i) {
            p.begin[i] = pads[i];
            p.end[i] = pads[i + n];
        }
    } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
        for (size_t i = 0; i < n; ++i) {
            int64_t out = (in_spatial[i] + strides[i] - 1) / strides[i];
            int64_t eff_kernel = (kernel[i] - 1) * dilations[i] + 1;
            int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + eff_kernel - in_spatial[i]);
            int64_t small = total / 2;
            p.begin[i] = auto_pad == "SAME_UPPER" ? small : total - small;
            p.end[i] = total - p.begin[i];
        }
    } else {
        ctx.require(auto_pad == "VALID", [&] { return "unknown auto_pad '" + auto_pad + "'"; });
    }
    return p;
}

Dims concatDims(const KernelContext& ctx, int64_t axis) {
    const Tensor& first = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(first.rank());
    Dims out_dims = first.dims();
    out_dims[axis] = 0;
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        const Tensor& t = ctx.input(i);
        ctx.require(t.dtype() == first.dtype() && t.rank() == first.rank(), [&] { return "input " + std::to_string(i) + " " + t.summary() + " does not match " + first.summary(); });
        for (int64_t d = 0; d < rank; ++d)
            ctx.require(d == axis || t.dims()[d] == first.dims()[d],
                        [&] { return "input " + std::to_string(i) + " " + t.summary() + " does not match " + first.summary() + " outside axis " + std::to_string(axis); });
        out_dims[axis] += t.dims()[axis];
    }
    return out_dims;
}

SlicePlan slicePlan(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    std::vector<int64_t> starts, ends, axes, steps;
    if (ctx.opset < 10) {
        starts = ctx.attrs().getInts("starts");
        ends = ctx.attrs().getInts("ends");
        axes = ctx.attrs().getInts("axes");
    } else {
        starts = ctx.input(1).toInt64Vector();
        ends = ctx.input(2).toInt64Vector();
        if (ctx.hasInput(3)) axes = ctx.input(3).toInt64Vector();
        if (ctx.hasInput(4)) steps = ctx.input(4).toInt64Vector();
    }
    if (axes.empty())
        for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    ctx.require(ends.size() == starts.size() && axes.size() == starts.size() && steps.size() == starts.size(), "starts/ends/axes/steps lengths differ");
    SlicePlan plan{Dims(rank, 0), Dims(rank, 1), x.dims()};
    for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t a = normalizeAxis(axes[i], rank, ctx);
        const int64_t s = steps[i];
        ctx.require(s != 0, "slice step cannot be 0");
        const SliceRange r = sliceRange(starts[i], ends[i], s, x.dims()[a]);
        plan.out_dims[a] = r.count;
        plan.begin[a] = r.first;
        plan.step[a] = s;
    }
    return plan;
}

PadPlan padPlan(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    std::vector<int64_t> pads;
    std::string mode = ctx.attrs().getString("mode", "constant");
    double value = 0;
    std::vector<int64_t> axes;
    if (ctx.opset < 11) {
        pads = ctx.attrs().getInts("pads");
        value = ctx.attrs().getFloat("value", 0.0f);
    } else {
        pads = ctx.input(1).toInt64Vector();
        if (const Tensor* v = ctx.optionalInput(2); v && v->numel() > 0) value = v->scalarAt(0);
        if (ctx.hasInput(3)) axes = ctx.input(3).toInt64Vector();
    }
    if (axes.empty())
        for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    ctx.require(pads.size() == 2 * axes.size(), "pads must have 2 values per padded axis");
    Dims begin(rank, 0), end(rank, 0);
    for (size_t i = 0; i < axes.size(); ++i) {
        int64_t a = normalizeAxis(axes[i], rank, ctx);
        begin[a] = pads[i];
        end[a] = pads[i + axes.size()];
    }
    Dims out_dims(rank);
    for (int64_t d = 0; d < rank; ++d) {
        out_dims[d] = x.dims()[d] + begin[d] + end[d];
        ctx.require(out_dims[d] >= 0, [&] { return "pads shrink axis " + std::to_string(d) + " below zero"; });
        ctx.require(mode != "reflect" || x.dims()[d] > std::max(begin[d], end[d]) || (begin[d] <= 0 && end[d] <= 0),
                    "reflect padding must be smaller than the axis");
    }
    ctx.require(mode == "constant" || mode == "reflect" || mode == "edge" || mode == "wrap", [&] { return "unsupported pad mode '" + mode + "'"; });
    return {begin, end, out_dims, mode, value};
}

}  // namespace kiln
