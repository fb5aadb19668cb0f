// Resize / Upsample planning: the options, scales and output dims a node asks for, and the
// source taps of each output coordinate along one axis (shared by the reference kernel and
// the fast one).
#include "backends/cpu/reference/resize_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

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

}  // namespace

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


ResizePlan planResize(const KernelContext& ctx) {
    ResizePlan plan;
    ResizeOptions& o = plan.options;
    std::vector<double>& roi = plan.roi;
    std::vector<double>& scales = plan.scales;
    Dims& out_dims = plan.out_dims;

    const Tensor& x = ctx.input(0);
    const size_t rank = x.rank();
    o.mode = ctx.attrs().getString("mode", "nearest");
    ctx.require(o.mode == "nearest" || o.mode == "linear" || o.mode == "cubic", [&] { return "unsupported mode '" + o.mode + "'"; });
    ctx.require(ctx.attrs().getInt("antialias", 0) == 0, "antialias is not supported");
    const bool legacy = ctx.opset < 11 || ctx.node.op_type == "Upsample";
    o.coord = legacy ? "asymmetric" : ctx.attrs().getString("coordinate_transformation_mode", "half_pixel");
    o.nearest = legacy ? "floor" : ctx.attrs().getString("nearest_mode", "round_prefer_floor");
    o.cubic_a = ctx.attrs().getFloat("cubic_coeff_a", -0.75f);
    o.exclude_outside = ctx.attrs().getInt("exclude_outside", 0) != 0;
    o.extrapolation = ctx.attrs().getFloat("extrapolation_value", 0.0f);
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
    out_dims.assign(rank, 0);
    const std::string policy = ctx.attrs().getString("keep_aspect_ratio_policy", "stretch");
    ctx.require(policy == "stretch" || policy == "not_larger" || policy == "not_smaller", [&] { return "unsupported keep_aspect_ratio_policy '" + policy + "'"; });
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
        return plan;
}

}  // namespace kiln
