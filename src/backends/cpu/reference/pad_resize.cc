// Pad (constant / reflect / edge / wrap) and Resize / Upsample (nearest, linear, cubic; every
// ONNX coordinate transformation mode up to opset 21, the axes and keep_aspect_ratio_policy
// attributes; not antialiasing).
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "backends/cpu/reference/kernel_util.h"
#include "backends/cpu/reference/resize_plan.h"

namespace kiln {

namespace {

std::vector<Tensor> pad(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const PadPlan plan = padPlan(ctx);
    const Dims &begin = plan.begin, &out_dims = plan.out_dims;
    const std::string& mode = plan.mode;
    const double value = plan.value;
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
                    else p = padSourceIndex(p, n, mode[0]);
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
    const ResizePlan plan = planResize(ctx);
    return {resizeTensor(ctx, ctx.input(0), plan.scales, plan.out_dims, plan.options, plan.roi)};
}

}  // namespace

void registerPadResizeKernels(KernelRegistry& r) {
    r.add("Pad", pad);
    r.add("Resize", resize);
    r.add("Upsample", resize);
}

}  // namespace kiln
