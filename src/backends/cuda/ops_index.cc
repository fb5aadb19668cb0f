// GPU implementations of Pad (every mode, negative pads crop), Tile (a strided copy over a
// view of twice the rank: each repeat reads the same input), CumSum, GatherND and GatherElements.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_op.h"
#include "ir/half.h"

namespace kiln::cuda {

namespace {

// One element of `t` holding `v`, as the device stores it.
std::vector<std::byte> elementBytes(DType t, double v) {
    std::vector<std::byte> out(dtypeSize(t));
    auto put = [&](auto x) { std::memcpy(out.data(), &x, sizeof x); };
    switch (t) {
        case DType::F32: put(static_cast<float>(v)); break;
        case DType::F64: put(v); break;
        case DType::F16: put(Half(static_cast<float>(v)).bits); break;
        case DType::BF16: put(BFloat16(static_cast<float>(v)).bits); break;
        case DType::I8: put(static_cast<int8_t>(v)); break;
        case DType::U8: put(static_cast<uint8_t>(v)); break;
        case DType::Bool: put(static_cast<uint8_t>(v != 0)); break;
        case DType::I16: put(static_cast<int16_t>(v)); break;
        case DType::I32: put(static_cast<int32_t>(v)); break;
        case DType::I64: put(static_cast<int64_t>(v)); break;
        default: throw Error(std::string("no device element for ") + std::string(dtypeName(t)));
    }
    return out;
}

std::vector<DeviceTensor> pad(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> pads;
    double value = 0;
    if (ctx.opset < 11) {
        pads = ctx.attrs().getInts("pads");
        value = ctx.attrs().getFloat("value", 0.f);
    } else {
        pads = ctx.hostInts(1);
        if (ctx.has(2)) {
            const DeviceTensor& v = ctx.input(2);
            if (!v.host) ctx.unsupported("a pad value computed on the device");
            ctx.require(v.host->numel() == 1, "constant_value must hold one value");
            value = v.host->scalarAt(0);
        }
    }
    std::vector<int64_t> axes;
    if (ctx.has(3)) axes = ctx.hostInts(3);
    if (axes.empty())
        for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    ctx.require(pads.size() == 2 * axes.size(), "pads must hold two values per padded axis");
    const std::string mode = ctx.attrs().getString("mode", "constant");
    PadSpec spec;
    if (mode == "constant") spec.mode = PadMode::Constant;
    else if (mode == "reflect") spec.mode = PadMode::Reflect;
    else if (mode == "edge") spec.mode = PadMode::Edge;
    else if (mode == "wrap") spec.mode = PadMode::Wrap;
    else ctx.require(false, "unknown mode '" + mode + "'");
    Dims out = x.dims;
    for (size_t i = 0; i < axes.size(); ++i) {
        int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
        ctx.require(a >= 0 && a < rank, "axis out of range");
        const int64_t begin = pads[i], end = pads[i + axes.size()];
        out[a] += begin + end;
        ctx.require(out[a] >= 0, "pads remove more than the axis holds");
        if (spec.mode != PadMode::Constant && (begin > 0 || end > 0)) ctx.require(x.dims[a] > 0, "cannot pad an empty axis by " + mode);
        spec.begin[a] = begin;
    }
    DeviceTensor y = ctx.output(0, x.logical, out);
    const auto fill = elementBytes(x.dtype, value);
    launchPad(dtypeSize(x.dtype), x.data, toShape6(x.dims, ctx), y.data, toShape6(out, ctx), spec, fill.data(), ctx.stream());
    return {y};
}

// Tile over [r0, d0, r1, d1, ...] (an axis repeated once keeps only d): the repeat axes
// have stride 0 in the input.
std::vector<DeviceTensor> tile(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const auto repeats = ctx.hostInts(1);
    ctx.require(repeats.size() == x.dims.size(), "repeats must hold one value per input axis");
    Dims out, wide;
    std::vector<int64_t> wide_strides;
    int64_t stride = x.numel();
    for (size_t d = 0; d < x.dims.size(); ++d) {
        ctx.require(repeats[d] >= 0, "repeats must not be negative");
        stride = x.dims[d] ? stride / x.dims[d] : 0;
        if (repeats[d] != 1) wide.push_back(repeats[d]), wide_strides.push_back(0);
        wide.push_back(x.dims[d]), wide_strides.push_back(stride);
        out.push_back(repeats[d] * x.dims[d]);
    }
    if (wide.size() > static_cast<size_t>(kMaxRank)) ctx.unsupported("Tile repeating " + std::to_string(wide.size() - x.dims.size()) + " axes of rank " + std::to_string(x.dims.size()));
    View6 src;
    for (size_t d = 0; d < wide.size(); ++d) src.strides[d] = wide_strides[d];
    DeviceTensor y = ctx.output(0, x.logical, out);
    if (y.numel() > 0) launchStridedCopy(dtypeSize(x.dtype), x.data, src, y.data, denseView(wide), toShape6(wide, ctx), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> cumSum(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const auto axis_values = ctx.hostInts(1);
    ctx.require(axis_values.size() == 1, "axis must hold one value");
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = axis_values[0] < 0 ? axis_values[0] + rank : axis_values[0];
    ctx.require(axis >= 0 && axis < rank, "axis out of range");
    const DType t = x.dtype;
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::I32 && t != DType::I64) ctx.unsupported(std::string("CumSum of ") + std::string(dtypeName(t)));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d) (d < axis ? outer : inner) *= d == axis ? 1 : x.dims[d];
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchCumSum(t, x.data, y.data, outer, x.dims[axis], inner, ctx.attrs().getInt("exclusive", 0) != 0, ctx.attrs().getInt("reverse", 0) != 0,
                 ctx.stream());
    return {y};
}

std::vector<DeviceTensor> gatherNd(OpContext& ctx) {
    const DeviceTensor& data = ctx.input(0);
    const DeviceTensor& idx = ctx.input(1);
    if (idx.dtype != DType::I64 && idx.dtype != DType::I32) ctx.unsupported(std::string("indices of ") + std::string(dtypeName(idx.dtype)));
    const int64_t b = ctx.attrs().getInt("batch_dims", 0), r = static_cast<int64_t>(data.dims.size()), q = static_cast<int64_t>(idx.dims.size());
    ctx.require(q >= 1 && b >= 0 && b < std::min(r, q), "batch_dims must be below the ranks of data and indices");
    const int64_t k = idx.dims.back();
    ctx.require(k >= 1 && b + k <= r, "the indices' last dim must be in [1, rank(data) - batch_dims]");
    if (k > kMaxGatherNdIndex) ctx.unsupported("index tuples of " + std::to_string(k));
    for (int64_t d = 0; d < b; ++d) ctx.require(data.dims[d] == idx.dims[d], "batch dims of data and indices differ");
    GatherNdSpec g;
    g.k = static_cast<int>(k);
    for (int64_t d = b + k; d < r; ++d) g.slice *= data.dims[d];
    int64_t stride = g.slice;
    for (int64_t j = k - 1; j >= 0; --j) {
        g.dims[j] = data.dims[b + j];
        g.strides[j] = stride;
        stride *= data.dims[b + j];
    }
    g.batch_stride = stride;
    for (int64_t d = b; d < q - 1; ++d) g.tuples_per_batch *= idx.dims[d];
    Dims out(idx.dims.begin(), idx.dims.end() - 1);
    out.insert(out.end(), data.dims.begin() + b + k, data.dims.end());
    DeviceTensor y = ctx.output(0, data.logical, out);
    launchGatherNd(dtypeSize(data.dtype), data.data, g, idx.dtype, idx.data, y.data, y.numel(), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> gatherElements(OpContext& ctx) {
    const DeviceTensor& data = ctx.input(0);
    const DeviceTensor& idx = ctx.input(1);
    if (idx.dtype != DType::I64 && idx.dtype != DType::I32) ctx.unsupported(std::string("indices of ") + std::string(dtypeName(idx.dtype)));
    const int64_t rank = static_cast<int64_t>(data.dims.size());
    ctx.require(static_cast<int64_t>(idx.dims.size()) == rank, "indices must have the rank of data");
    if (rank > kMaxRank) ctx.unsupported("rank " + std::to_string(rank));
    int64_t axis = ctx.attrs().getInt("axis", 0);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < rank, "axis out of range");
    DeviceTensor y = ctx.output(0, data.logical, idx.dims);
    if (y.numel() > 0) {
        ctx.require(data.dims[axis] > 0, "gathers from an empty axis");
        launchGatherElements(dtypeSize(data.dtype), data.data, denseView(data.dims), static_cast<int>(axis), data.dims[axis], idx.dtype, idx.data, y.data,
                             toShape6(idx.dims, ctx), ctx.stream());
    }
    return {y};
}

}  // namespace

void addIndexOps(std::map<std::string, OpFn>& ops) {
    ops["Pad"] = pad;
    ops["Tile"] = tile;
    ops["CumSum"] = cumSum;
    ops["GatherND"] = gatherNd;
    ops["GatherElements"] = gatherElements;
}

}  // namespace kiln::cuda
