// GPU implementations of TopK, NonZero and NonMaxSuppression. NonZero's and NMS's output
// lengths depend on the data: the op reads the count back (ctx.readBack), which keeps the
// signature out of CUDA graphs, and the values stay on the device.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

std::vector<DeviceTensor> topK(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    ctx.floatType(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = ctx.attrs().getInt("axis", -1);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < rank, "axis out of range");
    const int64_t k = ctx.opset >= 10 ? ctx.hostInts(1).at(0) : ctx.attrs().getInt("k");
    const int64_t len = x.dims[axis];
    ctx.require(k >= 0 && k <= len, "k=" + std::to_string(k) + " is out of range for an axis of " + std::to_string(len));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d)
        if (d != axis) (d < axis ? outer : inner) *= x.dims[d];
    if (outer * inner * len > INT32_MAX) ctx.unsupported("TopK over " + std::to_string(outer * inner * len) + " elements, above 2^31");
    Dims out = x.dims;
    out[axis] = k;
    DeviceTensor values = ctx.output(0, x.logical, out);
    DeviceTensor indices = ctx.output(1, DType::I64, out);
    const size_t scratch_bytes = topKScratchBytes(outer, len, inner);
    void* scratch = scratch_bytes ? ctx.res.scratch(1, scratch_bytes) : nullptr;
    launchTopK(x.dtype, x.data, values.data, indices.as<int64_t>(), outer, len, inner, k, ctx.attrs().getInt("largest", 1) != 0, scratch, ctx.stream());
    return {values, indices};
}

std::vector<DeviceTensor> nonZero(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const Shape6 shape = toShape6(x.dims, ctx);
    const int64_t n = x.numel();
    int64_t count = 0;
    const int64_t* flat = nullptr;
    if (n > 0) {
        void* scratch = ctx.res.scratch(1, nonZeroScratchBytes(x.dtype, n));
        flat = launchNonZeroSelect(x.dtype, x.data, n, scratch, ctx.stream());
        ctx.readBack(&count, scratch, sizeof count);
    }
    DeviceTensor y = ctx.output(0, DType::I64, {static_cast<int64_t>(x.dims.size()), count});
    if (!x.dims.empty()) launchUnravel(flat, count, shape, y.as<int64_t>(), ctx.stream());
    return {y};
}

// A scalar input the node reads on the host (a constant in exported detectors).
double hostScalar(OpContext& ctx, size_t i, double fallback) {
    if (!ctx.has(i)) return fallback;
    const DeviceTensor& t = *ctx.inputs[i];
    if (!t.host) ctx.unsupported("input " + std::to_string(i) + " is computed on the device");
    return t.host->numel() == 0 ? fallback : t.host->scalarAt(0);
}

std::vector<DeviceTensor> nonMaxSuppression(OpContext& ctx) {
    const DeviceTensor& boxes = ctx.input(0);
    const DeviceTensor& scores = ctx.input(1);
    ctx.require(boxes.logical == DType::F32 && scores.logical == DType::F32, "boxes and scores must be float32");
    ctx.require(boxes.dims.size() == 3 && boxes.dims[2] == 4, "boxes must be [batches, boxes, 4]");
    ctx.require(scores.dims.size() == 3 && scores.dims[0] == boxes.dims[0] && scores.dims[2] == boxes.dims[1],
                "scores must be [batches, classes, boxes] for the boxes");
    if (boxes.dtype != scores.dtype) ctx.unsupported("boxes and scores stored in different types");
    NmsProblem p;
    p.batches = boxes.dims[0], p.classes = scores.dims[1], p.spatial = boxes.dims[1];
    // Read as an integer: exporters pass INT64_MAX ("no limit"), which a double cannot hold.
    int64_t max_out = 0;
    if (ctx.has(2) && ctx.inputs[2]->host && ctx.inputs[2]->host->numel() > 0) max_out = ctx.hostInts(2)[0];
    else if (ctx.has(2) && !ctx.inputs[2]->host) ctx.unsupported("max_output_boxes_per_class is computed on the device");
    p.max_keep = std::min(std::max<int64_t>(max_out, 0), p.spatial);
    p.iou_threshold = static_cast<float>(hostScalar(ctx, 3, 0));
    p.has_score_threshold = ctx.has(4) && ctx.inputs[4]->host && ctx.inputs[4]->host->numel() > 0;
    p.score_threshold = static_cast<float>(hostScalar(ctx, 4, 0));
    const int64_t center = ctx.attrs().getInt("center_point_box", 0);
    ctx.require(center == 0 || center == 1, "center_point_box must be 0 or 1, got " + std::to_string(center));
    p.center_point_box = center == 1;
    // The sort indexes boxes as int, all classes' candidates at once.
    if (p.batches * p.classes * p.spatial > INT32_MAX) ctx.unsupported(std::to_string(p.batches * p.classes * p.spatial) + " scores, above 2^31");
    const int64_t pairs = p.batches * p.classes;
    int64_t total = 0;
    void* scratch = nullptr;
    if (pairs > 0 && p.max_keep > 0) {
        scratch = ctx.res.scratch(1, nmsScratchBytes(p));
        const int32_t* device_counts = launchNonMaxSuppression(boxes.dtype, p, boxes.data, scores.data, scratch, ctx.stream());
        std::vector<int32_t> counts(static_cast<size_t>(pairs));
        ctx.readBack(counts.data(), device_counts, counts.size() * sizeof(int32_t));
        total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    }
    DeviceTensor y = ctx.output(0, DType::I64, {total, 3});
    if (total > 0) launchPackSelected(p, scratch, y.as<int64_t>(), ctx.stream());
    return {y};
}

}  // namespace

void addSelectionOps(std::map<std::string, OpFn>& ops) {
    ops["TopK"] = topK;
    ops["NonZero"] = nonZero;
    ops["NonMaxSuppression"] = nonMaxSuppression;
}

}  // namespace kiln::cuda
