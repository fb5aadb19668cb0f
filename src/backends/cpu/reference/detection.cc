// Detection post-processing: NonMaxSuppression. Its output's length depends on the data, so
// it runs on the host on every backend (as in ONNX Runtime's CUDA provider).
#include <algorithm>
#include <numeric>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

namespace {

struct Box {
    float y1, x1, y2, x2;  // corners, smaller first
    float area() const { return (y2 - y1) * (x2 - x1); }
};

Box boxAt(const float* b, bool center_point) {
    if (center_point) {  // [x_center, y_center, width, height]
        const float hw = b[2] / 2, hh = b[3] / 2;
        return {b[1] - hh, b[0] - hw, b[1] + hh, b[0] + hw};
    }
    // [y1, x1, y2, x2] with either diagonal pair of corners.
    return {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
}

// Whether b suppresses a: IoU above the threshold. Empty boxes never suppress, as in ONNX
// Runtime.
bool suppresses(const Box& a, const Box& b, float iou_threshold) {
    const float ih = std::min(a.y2, b.y2) - std::max(a.y1, b.y1), iw = std::min(a.x2, b.x2) - std::max(a.x1, b.x1);
    if (ih <= 0 || iw <= 0) return false;
    const float inter = ih * iw, area_a = a.area(), area_b = b.area(), uni = area_a + area_b - inter;
    if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
    return inter / uni > iou_threshold;
}

// boxes [batches, spatial, 4], scores [batches, classes, spatial]; per batch and class, the
// boxes above score_threshold in descending score (ties: the lower index first), each kept
// unless a kept box overlaps it by more than iou_threshold, up to max_output_boxes_per_class.
// Output [selected, 3]: (batch, class, box).
std::vector<Tensor> nonMaxSuppression(const KernelContext& ctx) {
    const Tensor &boxes = ctx.input(0), &scores = ctx.input(1);
    ctx.require(boxes.dtype() == DType::F32 && scores.dtype() == DType::F32, "boxes and scores must be float32");
    ctx.require(boxes.rank() == 3 && boxes.dims()[2] == 4, [&] { return "boxes must be [batches, boxes, 4], got " + boxes.summary(); });
    ctx.require(scores.rank() == 3 && scores.dims()[0] == boxes.dims()[0] && scores.dims()[2] == boxes.dims()[1],
                [&] { return "scores " + scores.summary() + " must be [batches, classes, boxes] for boxes " + boxes.summary(); });
    auto scalar = [&](size_t i, double fallback) {
        if (!ctx.hasInput(i) || ctx.input(i).numel() == 0) return fallback;
        return ctx.input(i).scalarAt(0);
    };
    // Read as an integer: exporters pass INT64_MAX ("no limit"), which a double cannot hold.
    const int64_t max_out = ctx.hasInput(2) && ctx.input(2).numel() > 0 ? ctx.input(2).toInt64Vector()[0] : 0;
    const float iou_threshold = static_cast<float>(scalar(3, 0));
    const bool has_score_threshold = ctx.hasInput(4) && ctx.input(4).numel() > 0;
    const float score_threshold = static_cast<float>(scalar(4, 0));
    const int64_t center = ctx.attrs().getInt("center_point_box", 0);
    ctx.require(center == 0 || center == 1, [&] { return "center_point_box must be 0 or 1, got " + std::to_string(center); });
    const int64_t batches = boxes.dims()[0], spatial = boxes.dims()[1], classes = scores.dims()[1];
    std::vector<int64_t> selected;  // triples
    std::vector<int64_t> order;
    std::vector<Box> kept;
    for (int64_t n = 0; n < batches && max_out > 0; ++n) {
        std::vector<Box> all(static_cast<size_t>(spatial));
        for (int64_t i = 0; i < spatial; ++i) all[static_cast<size_t>(i)] = boxAt(boxes.data<float>() + (n * spatial + i) * 4, center == 1);
        for (int64_t c = 0; c < classes; ++c) {
            const float* s = scores.data<float>() + (n * classes + c) * spatial;
            order.clear();
            for (int64_t i = 0; i < spatial; ++i)
                if (!has_score_threshold || s[i] > score_threshold) order.push_back(i);
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
            kept.clear();
            for (int64_t i : order) {
                const Box& box = all[static_cast<size_t>(i)];
                if (std::any_of(kept.begin(), kept.end(), [&](const Box& k) { return suppresses(box, k, iou_threshold); })) continue;
                kept.push_back(box);
                selected.insert(selected.end(), {n, c, i});
                if (static_cast<int64_t>(kept.size()) == max_out) break;
            }
        }
    }
    return {Tensor::fromVector<int64_t>({static_cast<int64_t>(selected.size() / 3), 3}, selected)};
}

}  // namespace

void registerDetectionKernels(KernelRegistry& r) { r.add("NonMaxSuppression", nonMaxSuppression); }

}  // namespace kiln
