// Fast f32 Resize / Upsample over the last two axes (images, feature maps): the plan and the
// taps are the reference kernel's (resize_plan.h); the filter runs separably, each output row
// first as a weighted sum of at most four input rows (one vectorizable loop per tap), then
// each output pixel from at most four of that row's columns. Other resizes (outer axes,
// tf_crop_and_resize's extrapolated taps, other types) take the reference kernel.
#include <cstring>

#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"
#include "backends/cpu/reference/resize_plan.h"

namespace kiln {

namespace {

constexpr int kMaxTaps = 4;  // cubic

struct AxisTaps {
    std::vector<int64_t> index;  // kMaxTaps per output coordinate
    std::vector<float> weight;
    std::vector<int> count;
};

// False when some tap lies outside the input (the extrapolation value), which the reference
// kernel handles.
bool axisTapTable(const ResizePlan& plan, size_t axis, int64_t in, AxisTaps* t) {
    const int64_t out = plan.out_dims[axis], rank = static_cast<int64_t>(plan.out_dims.size());
    const bool has_roi = plan.roi.size() == 2 * plan.out_dims.size();
    const double rs = has_roi ? plan.roi[axis] : 0, re = has_roi ? plan.roi[axis + rank] : 1;
    t->index.assign(out * kMaxTaps, 0);
    t->weight.assign(out * kMaxTaps, 0.f);
    t->count.assign(out, 0);
    for (int64_t i = 0; i < out; ++i) {
        const auto taps = axisTaps(plan.options, i, plan.scales[axis], in, out, rs, re);
        if (taps.size() > kMaxTaps) return false;
        int n = 0;
        for (const Tap& tap : taps) {
            if (tap.index < 0) return false;
            if (tap.weight == 0) continue;  // skipped, as the reference does (0 * inf would be NaN)
            t->index[i * kMaxTaps + n] = tap.index;
            t->weight[i * kMaxTaps + n] = static_cast<float>(tap.weight);
            ++n;
        }
        t->count[i] = n;
    }
    return true;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void addScaledRow(float* acc, const float* src, float w, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i] += w * src[i];
}

std::vector<Tensor> fastResize(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const size_t rank = x.rank();
    if (x.dtype() != DType::F32 || rank < 2) return referenceFallback(ctx);
    const ResizePlan plan = planResize(ctx);
    tensorBytes(DType::F32, plan.out_dims, ctx.node.describe());  // a clean error for an absurd size, before the taps grow with it
    // The outer axes must map each index to itself (tf_half_pixel_for_nn with round_prefer_ceil
    // shifts even an unscaled axis by one).
    for (size_t d = 0; d + 2 < rank; ++d) {
        if (plan.out_dims[d] != x.dims()[d] || plan.scales[d] != 1.0) return referenceFallback(ctx);
        AxisTaps outer;
        if (!axisTapTable(plan, d, x.dims()[d], &outer)) return referenceFallback(ctx);
        for (int64_t i = 0; i < x.dims()[d]; ++i)
            if (outer.count[i] != 1 || outer.index[i * kMaxTaps] != i || outer.weight[i * kMaxTaps] != 1.f) return referenceFallback(ctx);
    }
    const int64_t H = x.dims()[rank - 2], W = x.dims()[rank - 1], OH = plan.out_dims[rank - 2], OW = plan.out_dims[rank - 1];
    AxisTaps rows, cols;
    if (!axisTapTable(plan, rank - 2, H, &rows) || !axisTapTable(plan, rank - 1, W, &cols)) return referenceFallback(ctx);
    Tensor y = ctx.output(0, DType::F32, plan.out_dims);
    if (y.numel() == 0) return {y};
    const int64_t planes = x.numel() / std::max<int64_t>(H * W, 1);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallelFor(planes * OH, y.numel() > 16384, [&](int64_t r) {
        const int64_t plane = r / OH, oh = r % OH;
        const float* src = px + plane * H * W;
        const int n = rows.count[oh];
        const int64_t* ri = &rows.index[oh * kMaxTaps];
        const float* rw = &rows.weight[oh * kMaxTaps];
        thread_local std::vector<float> line;
        const float* row = src + ri[0] * W;
        if (n != 1 || rw[0] != 1.f) {  // blend the input rows (one tap of weight 1: read it in place)
            line.assign(static_cast<size_t>(W), 0.f);
            for (int k = 0; k < n; ++k) addScaledRow(line.data(), src + ri[k] * W, rw[k], W);
            row = line.data();
        }
        float* out = py + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t* ci = &cols.index[ow * kMaxTaps];
            const float* cw = &cols.weight[ow * kMaxTaps];
            float v = 0;
            for (int k = 0; k < cols.count[ow]; ++k) v += cw[k] * row[ci[k]];
            out[ow] = v;
        }
    });
    return {y};
}

}  // namespace

void addResizeTactics(std::vector<Tactic>& t) { t.push_back({"fast", "resize", {"Resize", "Upsample"}, supportsAnyNode, fastResize}); }

}  // namespace kiln
