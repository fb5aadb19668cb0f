// Helpers shared by the reference kernels: axis handling and broadcasting.
#pragma once
#include <cmath>
#include <vector>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

// Maps a possibly negative axis into [0, rank); fails naming the node when out of range.
int64_t normalizeAxis(int64_t axis, int64_t rank, const KernelContext& ctx);

// Concat's output dims along `axis` (normalized); fails naming the input that does not fit.
Dims concatDims(const KernelContext& ctx, int64_t axis);

// Slice along one axis of length `dim`: the first index read and the element count, with
// start/end made non-negative and clamped as the ONNX Slice text says ([0, dim] for
// positive steps; start to [0, dim-1] and end to [-1, dim-1] for negative ones).
struct SliceRange {
    int64_t first = 0, count = 0;
};
SliceRange sliceRange(int64_t start, int64_t end, int64_t step, int64_t dim);

// A Slice node's selection of its input 0: per dim, the first index read, the step, and the
// output extent (from the attributes before opset 10, the inputs from then on).
struct SlicePlan {
    Dims begin, step, out_dims;
};
SlicePlan slicePlan(const KernelContext& ctx);

// A Pad node's padding of its input 0 per dim (negative pads crop), checked: the output
// dims, the mode ("constant", "reflect", "edge" or "wrap") and the constant value.
struct PadPlan {
    Dims begin, end, out_dims;
    std::string mode;
    double value = 0;
};
PadPlan padPlan(const KernelContext& ctx);
// Where Pad's modes "edge", "wrap" and "reflect" read position p (outside [0, n) or not) of
// an axis of n > 0 elements.
inline int64_t padSourceIndex(int64_t p, int64_t n, char mode) {
    if (p >= 0 && p < n) return p;
    if (mode == 'e') return p < 0 ? 0 : n - 1;
    if (mode == 'w') return ((p % n) + n) % n;
    const int64_t period = 2 * (n - 1);
    if (period == 0) return 0;
    p = ((p % period) + period) % period;
    return p >= n ? period - p : p;
}

// For each element of `out_dims` (row-major), the offset of the element of a tensor with
// dims `in_dims` that broadcasting maps to it.
std::vector<int64_t> broadcastOffsets(const Dims& out_dims, const Dims& in_dims);

// A broadcast output walked in runs along its (coalesced) last dimensions, without a table
// of offsets per element (which cost more than the ops themselves on masks of 16K
// elements): for each run, fn(out_offset, in_offsets) where input k's element j of the run
// is at in_offsets[k] + j * step(k), step 0 (broadcast) or 1. Dims along which every input
// is contiguous (or broadcast) together are merged first, so runs are as long as they can
// be. Inputs must broadcast to out_dims.
class BroadcastRuns {
public:
    BroadcastRuns(const Dims& out_dims, const std::vector<Dims>& in_dims);
    int64_t length() const { return length_; }
    int64_t runs() const { return length_ > 0 ? runs_ : 0; }
    int64_t step(size_t k) const { return steps_[k]; }
    // Input k's offset at the start of a run (random access, for runs shared among threads).
    int64_t offset(size_t k, int64_t run) const;
    // Consecutive runs within one index of the last outer dim (rowRuns() of them) step input
    // k's offset by runStride(k): 0 where the input repeats (a blocked per-channel constant),
    // length() where it is contiguous across them.
    int64_t rowRuns() const { return outer_.empty() ? 1 : outer_.back(); }
    int64_t runStride(size_t k) const { return outer_.empty() ? 0 : strides_[k].back(); }
    template <typename F>
    void forEach(F&& fn) const {
        forRuns(0, runs(), [&](int64_t r, const int64_t* offsets) { fn(r * length_, offsets); });
    }
    // fn(run, offsets) for runs [first, first + count): the inputs' offsets found once, then
    // stepped run to run (short runs, as blocked layouts give, would spend more on finding
    // each run's offsets than on its elements).
    template <typename F>
    void forRuns(int64_t first, int64_t count, F&& fn) const {
        if (count <= 0) return;
        const size_t inputs = steps_.size(), rank = outer_.size();
        std::vector<int64_t> idx(rank, 0), offsets(inputs, 0);
        for (size_t k = 0; k < inputs; ++k) offsets[k] = offset(k, first);
        for (int64_t rest = first, d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
            idx[d] = rest % outer_[d];
            rest /= outer_[d];
        }
        for (int64_t r = first; r < first + count; ++r) {
            fn(r, offsets.data());
            for (size_t d = rank; d-- > 0;) {  // odometer over the outer dims
                const bool carry = ++idx[d] == outer_[d];
                for (size_t k = 0; k < inputs; ++k) offsets[k] += carry ? -strides_[k][d] * (outer_[d] - 1) : strides_[k][d];
                if (!carry) break;
                idx[d] = 0;
            }
        }
    }

private:
    Dims outer_;                             // the output dims before the last
    std::vector<Dims> strides_;              // per input, its stride along each outer dim (0 when broadcast)
    std::vector<int64_t> steps_;
    int64_t length_ = 1, runs_ = 1;
};

// out[i] = f(a[...], b[...]) with numpy broadcasting; TOut is the output element type.
// Before opset 7, binary ops broadcast only with broadcast=1, aligning B at `axis` of A
// rather than at the right. Returns B reshaped so numpy broadcasting gives that result.
Tensor legacyBroadcastOperand(const Tensor& a, const Tensor& b, const KernelContext& ctx);

template <typename TOut, typename TA, typename TB, typename F>
Tensor broadcastBinary(const Tensor& a, const Tensor& b_in, const KernelContext& ctx, F f) {
    const Tensor b = legacyBroadcastOperand(a, b_in, ctx);
    Dims out_dims = broadcastDims(a.dims(), b.dims(), ctx.node.describe());
    Tensor out(DTypeOf<TOut>::value, out_dims);
    const TA* pa = a.data<TA>();
    const TB* pb = b.data<TB>();
    TOut* po = out.data<TOut>();
    const int64_t n = out.numel();
    if (a.dims() == out_dims && b.dims() == out_dims) {
        for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
    } else if (a.dims() == out_dims && b.numel() == 1) {
        for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[0]);
    } else {
        const BroadcastRuns runs(out_dims, {a.dims(), b.dims()});
        const int64_t len = runs.length(), sa = runs.step(0), sb = runs.step(1);
        runs.forEach([&](int64_t o, const int64_t* in) {
            for (int64_t j = 0; j < len; ++j) po[o + j] = f(pa[in[0] + j * sa], pb[in[1] + j * sb]);
        });
    }
    return out;
}

// Applies f to every element, producing the same dtype; f works on double.
template <typename T, typename F>
Tensor mapElements(const Tensor& x, F f) {
    Tensor out(x.dtype(), x.dims());
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) po[i] = static_cast<T>(f(static_cast<double>(px[i])));
    return out;
}

// The scalar function of a unary op or fused activation by name ("Relu", "Clip",
// "LeakyRelu", "GeluTanh", "Exp", ...), with up to two float parameters.
std::function<double(double)> unaryFunction(const std::string& name, float p0, float p1, const KernelContext& ctx);

// Reads an optional 1-D integer input (e.g. axes) or falls back to an attribute.
// Values computed in double, stored as a tensor of numeric type `t` (static_cast per element).
Tensor tensorFromDoubles(DType t, const Dims& dims, const std::vector<double>& values, const KernelContext& ctx);
std::vector<int64_t> intsFromInputOrAttr(const KernelContext& ctx, size_t input, const std::string& attr);

// Spatial padding resolved from pads / auto_pad for pooling and convolution.
struct SpatialPads {
    std::vector<int64_t> begin, end;
};
SpatialPads resolvePads(const KernelContext& ctx, const Dims& in_spatial, const std::vector<int64_t>& kernel,
                        const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations);
// A ConvTranspose's geometry (output_padding, output_shape and auto_pad resolved): the
// output is the full transposed convolution cropped by pad_begin at the start and pad_end
// at the end (pad_end < 0 where output_padding extends it).
struct DeconvGeometry {
    std::vector<int64_t> kernel, strides, dilations, pad_begin, pad_end;
    Dims out_spatial;
    int64_t group = 1, M = 0;  // M: output channels
};
DeconvGeometry deconvGeometry(const KernelContext& ctx, const Dims& x, const Dims& w);  // ctx: attributes and errors
// Output spatial size of a pooling window (auto_pad, pads, ceil_mode as ONNX defines them).
Dims poolOutputSpatial(const KernelContext& ctx, const Dims& in_spatial, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                       const std::vector<int64_t>& dilations, const SpatialPads& pads);

}  // namespace kiln
