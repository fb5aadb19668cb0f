// Pad (constant / reflect / edge / wrap) and Resize / Upsample (nearest, linear, cubic; every
// ONNX coordinate transformation mode up to opset 21, the axes and keep_aspect_ratio_policy
// attributes; not antialiasing).
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> pad(const KernelContext& ctx) {
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
        ctx.require(out_dims[d] >= 0, "pads shrink axis " + std::to_string(d) + " below zero");
        ctx.require(mode != "reflect" || x.dims()[d] > std::max(begin[d], end[d]) || (begin[d] <= 0 && end[d] <= 0),
                    "reflect padding must be smaller than the axis");
    }
    ctx.require(mode == "constant" || mode == "reflect" || mode == "edge" || mode == "wrap", "unsupported pad mode '" + mode + "'");
    const Dims xs = stridesOf(x.dims());
    return {dispatchDType(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        T* po = out.data<T>();
        const T fill = static_cast<T>(value);
        Dims idx(rank, 0);
        for (int64_t i = 0; i < out.numel(); ++i) {
            int64_t off = 0;
            bool outside = false;
            for (int64_t d = 0; d < rank; ++d) {
                int64_t p = idx[d] - begin[d];
                const int64_t n = x.dims()[d];
                if (p < 0 || p >= n) {
                    if (mode == "constant" || n == 0) outside = true;
                    else if (mode == "edge") p = std::clamp<int64_t>(p, 0, n - 1);
                    else if (mode == "wrap") p = ((p % n) + n) % n;
                    else {
                        const int64_t period = 2 * (n - 1);
                        p = period ? ((p % period) + period) % period : 0;
                        if (p >= n) p = period - p;
                    }
                }
                off += p * xs[d];
            }
            po[i] = outside ? fill : px[off];
            for (int64_t d = rank - 1; d >= 0; --d) {
                if (++idx[d] < out_dims[d]) break;
                idx[d] = 0;
            }
        }
        return out;
    })};
}

struct Tap {
    int64_t index;  // -1: outside (extrapolation value)
    double weight;
};

struct ResizeOptions {
    std::string mode, coord, nearest;
    double cubic_a = -0.75, extrapolation = 0;
    bool exclude_outside = false;
};

// `out_len` is the unrounded output length (in * scale), as the ONNX reference uses it.
double originalCoordinate(const ResizeOptions& o, double x, double scale, int64_t in, int64_t out, double roi_start, double roi_end) {
    const double out_len = static_cast<double>(in) * scale;
    if (o.coord == "half_pixel") return (x + 0.5) / scale - 0.5;
    if (o.coord == "half_pixel_symmetric") {  // opset 19: half_pixel, centred when the size was rounded
        const double adjustment = static_cast<double>(out) / out_len;
        return 0.5 * static_cast<double>(in) * (1 - adjustment) + (x + 0.5) / scale - 0.5;
    }
    if (o.coord == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
    if (o.coord == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    if (o.coord == "align_corners") return out_len == 1 ? 0.0 : x * static_cast<double>(in - 1) / (out_len - 1);
    if (o.coord == "tf_crop_and_resize")
        return out > 1 ? roi_start * static_cast<double>(in - 1) + x * (roi_end - roi_start) * static_cast<double>(in - 1) / static_cast<double>(out - 1)
                       : 0.5 * (roi_start + roi_end) * static_cast<double>(in - 1);
    return x / scale;  // asymmetric
}

int64_t nearestIndex(const ResizeOptions& o, double x, double scale) {
    if (o.nearest == "floor") return static_cast<int64_t>(std::floor(x));
    if (o.nearest == "ceil") return static_cast<int64_t>(std::ceil(x));
    // A tie within rounding error is a tie: coordinates such as half_pixel_symmetric's land
    // on .5 exactly in real arithmetic, and ONNX Runtime resolves them by the nearest mode.
    const double frac = x - std::floor(x);
    if (std::fabs(frac - 0.5) < 1e-6) return static_cast<int64_t>(o.nearest == "round_prefer_ceil" ? std::ceil(x) : std::floor(x));
    (void)scale;
    return static_cast<int64_t>(std::round(x));
}

std::vector<double> cubicCoefficients(double t, double a) {
    auto w = [a](double s) {
        s = std::fabs(s);
        if (s <= 1) return ((a + 2) * s - (a + 3)) * s * s + 1;
        if (s < 2) return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
        return 0.0;
    };
    return {w(t + 1), w(t), w(1 - t), w(2 - t)};
}

// Taps of one output coordinate along one axis.
std::vector<Tap> axisTaps(const ResizeOptions& o, int64_t out_i, double scale, int64_t in, int64_t out, double roi_start, double roi_end) {
    double x = originalCoordinate(o, static_cast<double>(out_i), scale, in, out, roi_start, roi_end);
    if (o.coord == "tf_crop_and_resize" && (x < 0 || x > static_cast<double>(in - 1))) return {{-1, 1.0}};
    if (o.mode == "nearest") return {{std::clamp<int64_t>(nearestIndex(o, x, scale), 0, in - 1), 1.0}};
    const int64_t x0 = static_cast<int64_t>(std::floor(x));
    const double t = x - static_cast<double>(x0);
    std::vector<Tap> taps;
    if (o.mode == "linear") {
        taps = {{x0, 1 - t}, {x0 + 1, t}};
    } else {
        auto c = cubicCoefficients(t, o.cubic_a);
        for (int k = 0; k < 4; ++k) taps.push_back({x0 - 1 + k, c[k]});
    }
    double total = 0;
    for (auto& tap : taps) {
        if (tap.index < 0 || tap.index >= in) {
            if (o.exclude_outside) tap.weight = 0;
            tap.index = std::clamp<int64_t>(tap.index, 0, in - 1);
        }
        total += tap.weight;
    }
    if (o.exclude_outside && total != 0)
        for (auto& tap : taps) tap.weight /= total;
    return taps;
}

Tensor resizeTensor(const KernelContext& ctx, const Tensor& x, const std::vector<double>& scales, const Dims& out_dims,
                    const ResizeOptions& o, const std::vector<double>& roi) {
    const size_t rank = x.rank();
    tensorBytes(x.dtype(), out_dims, ctx.node.describe());  // before the taps, which grow with the output
    // taps[d][i]: source taps of output index i along axis d (the filter is separable).
    std::vector<std::vector<std::vector<Tap>>> taps(rank);
    for (size_t d = 0; d < rank; ++d) {
        const bool has_roi = roi.size() == 2 * rank;
        const double rs = has_roi ? roi[d] : 0, re = has_roi ? roi[d + rank] : 1;
        for (int64_t i = 0; i < out_dims[d]; ++i) taps[d].push_back(axisTaps(o, i, scales[d], x.dims()[d], out_dims[d], rs, re));
    }
    const Dims xs = stridesOf(x.dims());
    return dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        T* po = out.data<T>();
        Dims idx(rank, 0);
        std::vector<size_t> tap_idx(rank);
        for (int64_t i = 0; i < out.numel(); ++i) {
            double acc = 0;
            bool extrapolate = false;
            std::fill(tap_idx.begin(), tap_idx.end(), 0);
            while (true) {
                double w = 1;
                int64_t off = 0;
                for (size_t d = 0; d < rank; ++d) {
                    const Tap& t = taps[d][idx[d]][tap_idx[d]];
                    if (t.index < 0) extrapolate = true;
                    w *= t.weight;
                    off += std::max<int64_t>(t.index, 0) * xs[d];
                }
                if (extrapolate) break;
                if (w != 0) acc += w * static_cast<double>(px[off]);
                size_t d = rank;
                while (d > 0 && ++tap_idx[d - 1] == taps[d - 1][idx[d - 1]].size()) tap_idx[--d] = 0;
                if (d == 0) break;
            }
            if (extrapolate) acc = o.extrapolation;
            if constexpr (std::is_integral_v<T>) acc = std::round(acc);
            po[i] = static_cast<T>(acc);
            for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
                if (++idx[d] < out_dims[d]) break;
                idx[d] = 0;
            }
        }
        return out;
    });
}

std::vector<Tensor> resize(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const size_t rank = x.rank();
    ResizeOptions o;
    o.mode = ctx.attrs().getString("mode", "nearest");
    ctx.require(o.mode == "nearest" || o.mode == "linear" || o.mode == "cubic", "unsupported mode '" + o.mode + "'");
    ctx.require(ctx.attrs().getInt("antialias", 0) == 0, "antialias is not supported");
    const bool legacy = ctx.opset < 11 || ctx.node.op_type == "Upsample";
    o.coord = legacy ? "asymmetric" : ctx.attrs().getString("coordinate_transformation_mode", "half_pixel");
    o.nearest = legacy ? "floor" : ctx.attrs().getString("nearest_mode", "round_prefer_floor");
    o.cubic_a = ctx.attrs().getFloat("cubic_coeff_a", -0.75f);
    o.exclude_outside = ctx.attrs().getInt("exclude_outside", 0) != 0;
    o.extrapolation = ctx.attrs().getFloat("extrapolation_value", 0.0f);
    std::vector<double> roi, scales;
    std::vector<int64_t> sizes;
    if (ctx.node.op_type == "Upsample") {
        if (ctx.opset < 9) {
            for (float f : ctx.attrs().getFloats("scales")) scales.push_back(f);
        } else {
            scales = ctx.input(1).toDoubleVector();
        }
    } else if (legacy) {
        scales = ctx.input(1).toDoubleVector();
    } else {
        roi = (ctx.hasInput(1) ? ctx.input(1).toDoubleVector() : std::vector<double>{});
        scales = (ctx.hasInput(2) ? ctx.input(2).toDoubleVector() : std::vector<double>{});
        if (const Tensor* s = ctx.optionalInput(3); s && s->numel() > 0) sizes = s->toInt64Vector();
    }
    // Opset 18's axes: scales, sizes and roi name only those axes; the others keep their size.
    std::vector<int64_t> axes;
    for (int64_t a : ctx.attrs().getInts("axes")) axes.push_back(normalizeAxis(a, static_cast<int64_t>(rank), ctx));
    if (!axes.empty()) {
        const size_t given = !sizes.empty() ? sizes.size() : scales.size();
        ctx.require(given == axes.size(), "scales or sizes must have one value per axis in 'axes'");
        ctx.require(roi.empty() || roi.size() == 2 * axes.size(), "roi must have two values per axis in 'axes'");
        std::vector<double> full_scales(rank, 1.0), full_roi;
        std::vector<int64_t> full_sizes(x.dims().begin(), x.dims().end());
        if (!roi.empty()) {
            full_roi.assign(2 * rank, 0.0);
            for (size_t d = 0; d < rank; ++d) full_roi[d + rank] = 1.0;
        }
        for (size_t i = 0; i < axes.size(); ++i) {
            if (!sizes.empty()) full_sizes[static_cast<size_t>(axes[i])] = sizes[i];
            else full_scales[static_cast<size_t>(axes[i])] = scales[i];
            if (!roi.empty()) full_roi[static_cast<size_t>(axes[i])] = roi[i], full_roi[static_cast<size_t>(axes[i]) + rank] = roi[i + axes.size()];
        }
        if (!sizes.empty()) sizes = full_sizes;
        else scales = full_scales;
        roi = full_roi;
    }
    Dims out_dims(rank);
    const std::string policy = ctx.attrs().getString("keep_aspect_ratio_policy", "stretch");
    ctx.require(policy == "stretch" || policy == "not_larger" || policy == "not_smaller", "unsupported keep_aspect_ratio_policy '" + policy + "'");
    if (!sizes.empty() && policy != "stretch") {
        // One scale for the resized axes, the largest (smallest) that keeps every one within
        // (beyond) its requested size; sizes then follow from it, rounded half up.
        ctx.require(sizes.size() == rank, "sizes must have one value per input dim");
        double scale = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
        for (size_t d = 0; d < rank; ++d) {
            if (!axes.empty() && std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) == axes.end()) continue;
            const double s = static_cast<double>(sizes[d]) / static_cast<double>(x.dims()[d]);
            scale = policy == "not_larger" ? std::min(scale, s) : std::max(scale, s);
        }
        scales.assign(rank, 1.0);
        for (size_t d = 0; d < rank; ++d) {
            if (!axes.empty() && std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) == axes.end()) {
                out_dims[d] = x.dims()[d];
                continue;
            }
            scales[d] = scale;
            const double n = std::floor(scale * static_cast<double>(x.dims()[d]) + 0.5);
            ctx.require(n >= 0 && n < 9.2e18, "keep_aspect_ratio_policy gives an output size out of range");
            out_dims[d] = static_cast<int64_t>(n);
        }
    } else if (!sizes.empty()) {
        ctx.require(sizes.size() == rank, "sizes must have one value per input dim");
        scales.resize(rank);
        for (size_t d = 0; d < rank; ++d) {
            ctx.require(sizes[d] >= 0, "sizes must not be negative");
            out_dims[d] = sizes[d];
            scales[d] = static_cast<double>(sizes[d]) / static_cast<double>(x.dims()[d]);
        }
    } else {
        ctx.require(scales.size() == rank, "needs scales or sizes with one value per input dim");
        for (size_t d = 0; d < rank; ++d) {
            const double n = std::floor(static_cast<double>(x.dims()[d]) * scales[d]);
            ctx.require(scales[d] > 0 && n < 9.2e18, [&] { return "scale " + std::to_string(scales[d]) + " for axis " + std::to_string(d) + " must be positive and give a representable size"; });
            out_dims[d] = static_cast<int64_t>(n);
        }
    }
    return {resizeTensor(ctx, x, scales, out_dims, o, roi)};
}

}  // namespace

void registerPadResizeKernels(KernelRegistry& r) {
    r.add("Pad", pad);
    r.add("Resize", resize);
    r.add("Upsample", resize);
}

}  // namespace kiln
