// GPU implementations of reductions (ReduceSum/Mean/Max/Min over one run of consecutive
// axes), ArgMax/ArgMin, inference BatchNormalization and Resize of the last two axes.
#include <algorithm>
#include <numeric>

#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

std::vector<DeviceTensor> reduce(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> axes = ctx.attrs().getInts("axes");
    if (ctx.has(1)) axes = ctx.hostInts(1);
    if (axes.empty()) {
        if (ctx.attrs().getInt("noop_with_empty_axes", 0) != 0) ctx.unsupported("noop_with_empty_axes");
        axes.resize(static_cast<size_t>(rank));
        std::iota(axes.begin(), axes.end(), 0);
    }
    for (int64_t& a : axes) {
        ctx.require(a >= -rank && a < rank, "axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
        if (a < 0) a += rank;
    }
    std::sort(axes.begin(), axes.end());
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    if (axes.empty() || axes.back() - axes.front() + 1 != static_cast<int64_t>(axes.size())) ctx.unsupported("reduced axes that are not consecutive");
    int64_t outer = 1, r = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d) (d < axes.front() ? outer : (d > axes.back() ? inner : r)) *= x.dims[d];
    if (r == 0) ctx.unsupported("reduction over an empty axis");
    const bool keep = ctx.attrs().getInt("keepdims", 1) != 0;
    Dims out;
    for (int64_t d = 0; d < rank; ++d) {
        if (d < axes.front() || d > axes.back()) out.push_back(x.dims[d]);
        else if (keep) out.push_back(1);
    }
    static const std::map<std::string, ReduceOp> ops = {{"ReduceSum", ReduceOp::Sum}, {"ReduceMean", ReduceOp::Mean}, {"ReduceMax", ReduceOp::Max}, {"ReduceMin", ReduceOp::Min}};
    DeviceTensor y = ctx.output(0, x.logical, out);
    launchReduce(t, ops.at(ctx.node.op_type), x.data, y.data, outer, r, inner, ctx.stream());
    return {y};
}

std::vector<DeviceTensor> argExtreme(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = x.dtype == DType::I32 || x.dtype == DType::I64 ? x.dtype : ctx.floatType(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = ctx.attrs().getInt("axis", 0);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < rank, "axis out of range");
    ctx.require(x.dims[axis] > 0, "ArgMax/ArgMin over an empty axis");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d)
        if (d != axis) (d < axis ? outer : inner) *= x.dims[d];
    const bool keep = ctx.attrs().getInt("keepdims", 1) != 0;
    Dims out;
    for (int64_t d = 0; d < rank; ++d)
        if (d != axis) out.push_back(x.dims[d]);
        else if (keep) out.push_back(1);
    DeviceTensor y = ctx.output(0, DType::I64, out);
    launchArgExtreme(t, ctx.node.op_type == "ArgMax", ctx.attrs().getInt("select_last_index", 0) != 0, x.data, static_cast<int64_t*>(y.data), outer,
                     x.dims[axis], inner, ctx.stream());
    return {y};
}

std::vector<DeviceTensor> batchNorm(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    for (size_t o = 1; o < ctx.node.outputs.size(); ++o)
        if (!ctx.node.outputs[o].empty()) ctx.unsupported("training-mode outputs");
    if (ctx.attrs().getInt("training_mode", 0) != 0) ctx.unsupported("training_mode");
    ctx.require(x.dims.size() >= 2, "input must have rank >= 2");
    const int64_t c = x.dims[1];
    const DType pt = ctx.floatType(1);
    for (size_t i = 1; i <= 4; ++i) {
        ctx.require(ctx.has(i), "needs scale, B, mean and var");
        if (ctx.input(i).numel() != c) ctx.unsupported("parameters that are not one value per channel");
        if (ctx.input(i).dtype != pt) ctx.unsupported("parameters of different types");
    }
    int64_t inner = 1;
    for (size_t d = 2; d < x.dims.size(); ++d) inner *= x.dims[d];
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchBatchNorm(t, pt, x.data, ctx.input(1).data, ctx.input(2).data, ctx.input(3).data, ctx.input(4).data, y.data, x.dims[0], c, inner,
                    ctx.attrs().getFloat("epsilon", 1e-5f), ctx.stream());
    return {y};
}

int32_t enumFrom(const OpContext& ctx, const std::string& attr, const std::string& value, const std::vector<std::string>& names) {
    const auto it = std::find(names.begin(), names.end(), value);
    if (it == names.end()) ctx.unsupported(attr + " '" + value + "'");
    return static_cast<int32_t>(it - names.begin());
}

std::vector<DeviceTensor> resize(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    const size_t rank = x.dims.size();
    if (rank < 2) ctx.unsupported("rank " + std::to_string(rank));
    const bool legacy = ctx.opset < 11 || ctx.node.op_type == "Upsample";
    if (ctx.attrs().getInt("antialias", 0) != 0) ctx.unsupported("antialias");
    if (ctx.attrs().getString("keep_aspect_ratio_policy", "stretch") != "stretch") ctx.unsupported("keep_aspect_ratio_policy");
    Resize2d p;
    p.mode = enumFrom(ctx, "mode", ctx.attrs().getString("mode", "nearest"), {"nearest", "linear", "cubic"});
    p.coord = legacy ? kCoordAsymmetric
                     : enumFrom(ctx, "coordinate_transformation_mode", ctx.attrs().getString("coordinate_transformation_mode", "half_pixel"),
                                {"half_pixel", "half_pixel_symmetric", "tf_half_pixel_for_nn", "pytorch_half_pixel", "align_corners", "asymmetric"});
    p.nearest = legacy ? kNearestFloor
                       : enumFrom(ctx, "nearest_mode", ctx.attrs().getString("nearest_mode", "round_prefer_floor"),
                                  {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"});
    p.cubic_a = ctx.attrs().getFloat("cubic_coeff_a", -0.75f);
    p.exclude_outside = ctx.attrs().getInt("exclude_outside", 0) != 0;
    std::vector<double> scales;
    std::vector<int64_t> sizes;
    if (ctx.node.op_type == "Upsample" && ctx.opset < 9) {
        for (float f : ctx.attrs().getFloats("scales")) scales.push_back(f);
    } else {
        const size_t scales_at = legacy ? 1 : 2;
        if (ctx.has(scales_at) && ctx.input(scales_at).numel() > 0) {
            if (!ctx.input(scales_at).host) ctx.unsupported("scales computed on the device");
            scales = ctx.input(scales_at).host->toDoubleVector();
        }
        if (!legacy && ctx.has(3) && ctx.input(3).numel() > 0) sizes = ctx.hostInts(3);
    }
    // Opset 18's axes name the axes the scales or sizes cover; the rest keep their size.
    std::vector<int64_t> axes = ctx.attrs().getInts("axes");
    if (!axes.empty()) {
        std::vector<double> full_scales(rank, 1.0);
        std::vector<int64_t> full_sizes(x.dims.begin(), x.dims.end());
        const size_t given = sizes.empty() ? scales.size() : sizes.size();
        ctx.require(given == axes.size(), "scales or sizes must have one value per axis in 'axes'");
        for (size_t i = 0; i < axes.size(); ++i) {
            int64_t a = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
            ctx.require(a >= 0 && a < static_cast<int64_t>(rank), "axes out of range");
            if (sizes.empty()) full_scales[static_cast<size_t>(a)] = scales[i];
            else full_sizes[static_cast<size_t>(a)] = sizes[i];
        }
        if (sizes.empty()) scales = full_scales;
        else sizes = full_sizes;
    }
    Dims out(rank);
    std::vector<double> scale(rank);
    if (!sizes.empty()) {
        ctx.require(sizes.size() == rank, "sizes must have one value per input dim");
        for (size_t d = 0; d < rank; ++d) {
            ctx.require(sizes[d] >= 0, "sizes must not be negative");
            out[d] = sizes[d];
            scale[d] = static_cast<double>(sizes[d]) / static_cast<double>(x.dims[d]);
        }
    } else {
        ctx.require(scales.size() == rank, "needs scales or sizes with one value per input dim");
        for (size_t d = 0; d < rank; ++d) {
            ctx.require(scales[d] > 0, "scales must be positive");
            out[d] = static_cast<int64_t>(std::floor(static_cast<double>(x.dims[d]) * scales[d]));
            scale[d] = scales[d];
        }
    }
    for (size_t d = 0; d + 2 < rank; ++d)
        if (out[d] != x.dims[d]) ctx.unsupported("resizing an axis other than the last two");
    p.planes = 1;
    for (size_t d = 0; d + 2 < rank; ++d) p.planes *= x.dims[d];
    p.h = {x.dims[rank - 2], out[rank - 2], scale[rank - 2]};
    p.w = {x.dims[rank - 1], out[rank - 1], scale[rank - 1]};
    DeviceTensor y = ctx.output(0, x.logical, out);
    launchResize2d(t, p, x.data, y.data, ctx.stream());
    return {y};
}

}  // namespace

void addReduceResizeOps(std::map<std::string, OpFn>& ops) {
    for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}) ops[op] = reduce;
    ops["ArgMax"] = argExtreme;
    ops["ArgMin"] = argExtreme;
    ops["BatchNormalization"] = batchNorm;
    ops["Resize"] = resize;
    ops["Upsample"] = resize;
}

}  // namespace kiln::cuda
