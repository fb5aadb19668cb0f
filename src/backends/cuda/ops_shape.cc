// GPU implementations of data-movement ops. Reshape-like ops are views (no copy); the
// others are one strided copy each (Transpose, Concat, Split, Slice, Expand) or a gather.
#include <algorithm>

#include "backends/cpu/reference/kernel_util.h"
#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

int64_t normalize(int64_t axis, int64_t rank, const OpContext& ctx) {
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < std::max<int64_t>(rank, 1), "axis out of range");
    return axis;
}

std::vector<int64_t> rowMajorStrides(const Dims& dims) {
    std::vector<int64_t> s(dims.size(), 1);
    for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * dims[d + 1];
    return s;
}

std::vector<DeviceTensor> reshape(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const auto shape = ctx.hostInts(1);
    const bool allow_zero = ctx.attrs().getInt("allowzero", 0) != 0;
    Dims dims;
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        int64_t d = shape[i];
        if (d == 0 && !allow_zero) {
            ctx.require(i < x.dims.size(), "shape copies a dim the input does not have");
            d = x.dims[i];
        }
        if (d == -1) {
            ctx.require(infer < 0, "more than one -1 in the shape");
            infer = static_cast<int64_t>(i);
            dims.push_back(1);
            continue;
        }
        ctx.require(d >= 0, "negative dim in the shape");
        known *= d;
        dims.push_back(d);
    }
    if (infer >= 0) {
        ctx.require(known != 0 && x.numel() % known == 0, "cannot infer the -1 dim");
        dims[infer] = x.numel() / known;
    }
    ctx.require(numElements(dims) == x.numel(), "shape " + dimsToString(dims) + " does not match " + dimsToString(x.dims));
    return {ctx.view(0, 0, dims)};
}

std::vector<DeviceTensor> flatten(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = ctx.attrs().getInt("axis", 1);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis <= rank, "axis out of range");
    int64_t outer = 1, inner = 1;  // both from the dims: [0, 1, 4] flattens to [0, 4]
    for (int64_t d = 0; d < rank; ++d) (d < axis ? outer : inner) *= x.dims[d];
    return {ctx.view(0, 0, Dims{outer, inner})};
}

std::vector<int64_t> axesOf(OpContext& ctx) {
    if (ctx.opset >= 13) return ctx.has(1) ? ctx.hostInts(1) : std::vector<int64_t>{};
    return ctx.attrs().getInts("axes");
}

std::vector<DeviceTensor> squeeze(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    auto axes = axesOf(ctx);
    for (auto& a : axes) a = normalize(a, rank, ctx);
    Dims dims;
    for (int64_t d = 0; d < rank; ++d) {
        const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
        if (axes.empty() ? x.dims[d] == 1 : listed) {
            ctx.require(x.dims[d] == 1, "squeezed dim is not 1");
            continue;
        }
        dims.push_back(x.dims[d]);
    }
    return {ctx.view(0, 0, dims)};
}

std::vector<DeviceTensor> unsqueeze(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    auto axes = axesOf(ctx);
    const int64_t rank = static_cast<int64_t>(x.dims.size() + axes.size());
    for (auto& a : axes) a = normalize(a, rank, ctx);
    Dims dims;
    size_t next = 0;
    for (int64_t d = 0; d < rank; ++d) {
        if (std::find(axes.begin(), axes.end(), d) != axes.end()) dims.push_back(1);
        else {
            ctx.require(next < x.dims.size(), "duplicate axes");
            dims.push_back(x.dims[next++]);
        }
    }
    return {ctx.view(0, 0, dims)};
}

std::vector<DeviceTensor> identity(OpContext& ctx) { return {ctx.view(0, 0, ctx.input(0).dims)}; }

std::vector<DeviceTensor> transpose(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const size_t rank = x.dims.size();
    auto perm = ctx.attrs().getInts("perm");
    if (perm.empty())
        for (size_t d = 0; d < rank; ++d) perm.push_back(static_cast<int64_t>(rank - 1 - d));
    ctx.require(perm.size() == rank, "perm has the wrong length");
    const auto in_strides = rowMajorStrides(x.dims);
    Dims dims(rank);
    View6 src;
    for (size_t d = 0; d < rank; ++d) {
        const int64_t p = normalize(perm[d], static_cast<int64_t>(rank), ctx);
        dims[d] = x.dims[p];
        src.strides[d] = in_strides[p];
    }
    DeviceTensor y = ctx.output(0, x.logical, dims);
    launchStridedCopy(dtypeSize(x.dtype), x.data, src, y.data, denseView(dims), toShape6(dims, ctx), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> concat(OpContext& ctx) {
    const DeviceTensor& first = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(first.dims.size());
    const int64_t axis = normalize(ctx.attrs().getInt("axis"), rank, ctx);
    Dims dims = first.dims;
    dims[axis] = 0;
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        const DeviceTensor& x = ctx.input(i);
        ctx.require(x.dims.size() == first.dims.size() && x.dtype == first.dtype, "inputs differ in rank or type");
        for (int64_t d = 0; d < rank; ++d) ctx.require(d == axis || x.dims[d] == first.dims[d], "inputs differ outside the axis");
        dims[axis] += x.dims[axis];
    }
    DeviceTensor y = ctx.output(0, first.logical, dims);
    const auto out_strides = rowMajorStrides(dims);
    int64_t at = 0;
    for (size_t i = 0; i < ctx.numInputs(); ++i) {
        const DeviceTensor& x = ctx.input(i);
        View6 dst;
        dst.offset = at * out_strides[axis];
        for (int64_t d = 0; d < rank; ++d) dst.strides[d] = out_strides[d];
        launchStridedCopy(dtypeSize(x.dtype), x.data, denseView(x.dims), y.data, dst, toShape6(x.dims, ctx), ctx.stream());
        at += x.dims[axis];
    }
    return {y};
}

std::vector<DeviceTensor> split(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const int64_t axis = normalize(ctx.attrs().getInt("axis", 0), rank, ctx);
    const int64_t n = static_cast<int64_t>(ctx.node.outputs.size());
    const int64_t len = x.dims[axis];
    std::vector<int64_t> sizes = ctx.opset >= 13 ? (ctx.has(1) ? ctx.hostInts(1) : std::vector<int64_t>{}) : ctx.attrs().getInts("split");
    if (sizes.empty()) {
        const int64_t chunk = (len + n - 1) / n;
        for (int64_t i = 0; i < n; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, len - i * chunk)));
    }
    ctx.require(static_cast<int64_t>(sizes.size()) == n, "split sizes do not match the outputs");
    int64_t total = 0;
    for (auto s : sizes) total += s;
    ctx.require(total == len, "split sizes do not add up to the axis");
    const auto in_strides = rowMajorStrides(x.dims);
    std::vector<DeviceTensor> outs;
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
        Dims dims = x.dims;
        dims[axis] = sizes[i];
        View6 src;
        src.offset = at * in_strides[axis];
        for (int64_t d = 0; d < rank; ++d) src.strides[d] = in_strides[d];
        DeviceTensor y = ctx.output(i, x.logical, dims);
        launchStridedCopy(dtypeSize(x.dtype), x.data, src, y.data, denseView(dims), toShape6(dims, ctx), ctx.stream());
        outs.push_back(y);
        at += sizes[i];
    }
    return outs;
}

std::vector<DeviceTensor> slice(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> starts, ends, axes, steps;
    if (ctx.opset >= 10) {
        starts = ctx.hostInts(1);
        ends = ctx.hostInts(2);
        if (ctx.has(3)) axes = ctx.hostInts(3);
        if (ctx.has(4)) steps = ctx.hostInts(4);
    } else {
        starts = ctx.attrs().getInts("starts");
        ends = ctx.attrs().getInts("ends");
        axes = ctx.attrs().getInts("axes");
    }
    ctx.require(starts.size() == ends.size(), "starts and ends differ in length");
    if (axes.empty())
        for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    ctx.require(axes.size() == starts.size() && steps.size() == starts.size(), "axes/steps length");
    const auto in_strides = rowMajorStrides(x.dims);
    Dims dims = x.dims;
    View6 src;
    for (int64_t d = 0; d < rank; ++d) src.strides[d] = in_strides[d];
    for (size_t i = 0; i < axes.size(); ++i) {
        const int64_t a = normalize(axes[i], rank, ctx), len = x.dims[a], step = steps[i];
        ctx.require(step != 0, "step 0");
        const SliceRange r = sliceRange(starts[i], ends[i], step, len);
        dims[a] = r.count;
        src.offset += r.first * in_strides[a];
        src.strides[a] = step * in_strides[a];
    }
    DeviceTensor y = ctx.output(0, x.logical, dims);
    if (y.numel() > 0) launchStridedCopy(dtypeSize(x.dtype), x.data, src, y.data, denseView(dims), toShape6(dims, ctx), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> expand(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const auto shape = ctx.hostInts(1);
    const Dims dims = broadcastDims(x.dims, Dims(shape.begin(), shape.end()), ctx.node.describe());
    DeviceTensor y = ctx.output(0, x.logical, dims);
    launchStridedCopy(dtypeSize(x.dtype), x.data, broadcastView(x.dims, dims, ctx), y.data, denseView(dims), toShape6(dims, ctx), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> gather(OpContext& ctx) {
    const DeviceTensor& data = ctx.input(0);
    const DeviceTensor& idx = ctx.input(1);
    const int64_t rank = static_cast<int64_t>(data.dims.size());
    const int64_t axis = normalize(ctx.attrs().getInt("axis", 0), rank, ctx);
    if (idx.dtype != DType::I64 && idx.dtype != DType::I32) ctx.unsupported("index type");
    if (idx.host) {  // constant indices: check the range as the CPU does
        for (int64_t k : idx.host->toInt64Vector())
            ctx.require(k >= -data.dims[axis] && k < data.dims[axis], "index " + std::to_string(k) + " out of range");
    }
    Dims dims(data.dims.begin(), data.dims.begin() + axis);
    dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
    dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data.dims[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= data.dims[d];
    DeviceTensor y = ctx.output(0, data.logical, dims);
    launchGather(dtypeSize(data.dtype), data.data, idx.dtype, idx.data, y.data, outer, data.dims[axis], idx.numel(), inner, ctx.stream());
    return {y};
}

}  // namespace

void addShapeOps(std::map<std::string, OpFn>& ops) {
    ops["Reshape"] = reshape;
    ops["Flatten"] = flatten;
    ops["Squeeze"] = squeeze;
    ops["Unsqueeze"] = unsqueeze;
    ops["Identity"] = identity;
    ops["Transpose"] = transpose;
    ops["Concat"] = concat;
    ops["Split"] = split;
    ops["Slice"] = slice;
    ops["Expand"] = expand;
    ops["Gather"] = gather;
}

}  // namespace kiln::cuda
