// Pooling: MaxPool (with Indices), AveragePool, LpPool and the global variants, any
// number of spatial dims, with ceil_mode, dilations and padding.
#include <cmath>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class PoolKind { Max, Average, Lp };

template <PoolKind Kind>
std::vector<Tensor> pool(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 3, [&] { return "input must have rank >= 3 (N, C, spatial...), got " + x.summary(); });
    const size_t S = x.rank() - 2;
    const Dims in_spatial(x.dims().begin() + 2, x.dims().end());
    auto kernel = ctx.attrs().getInts("kernel_shape");
    ctx.require(kernel.size() == S, [&] { return "kernel_shape must have " + std::to_string(S) + " values"; });
    auto strides = ctx.attrs().getInts("strides", Dims(S, 1));
    auto dilations = ctx.attrs().getInts("dilations", Dims(S, 1));
    const bool include_pad = ctx.attrs().getInt("count_include_pad", 0) != 0;
    const double p = static_cast<double>(ctx.attrs().getInt("p", 2));
    SpatialPads pads = resolvePads(ctx, in_spatial, kernel, strides, dilations);
    const Dims out_spatial = poolOutputSpatial(ctx, in_spatial, kernel, strides, dilations, pads);
    const int64_t NC = x.dims()[0] * x.dims()[1];
    Dims out_dims = {x.dims()[0], x.dims()[1]};
    out_dims.insert(out_dims.end(), out_spatial.begin(), out_spatial.end());
    const int64_t in_size = numElements(in_spatial), out_size = numElements(out_spatial), k_size = numElements(kernel);
    const Dims in_strides = stridesOf(in_spatial);
    const bool col_major = ctx.attrs().getInt("storage_order", 0) != 0;
    Tensor indices(DType::I64, out_dims);

    Tensor y = dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        T* po = out.data<T>();
        Dims o_idx(S, 0), k_idx(S, 0);
        for (int64_t o = 0; o < out_size; ++o) {
            for (int64_t c = 0; c < NC; ++c) {
                double acc = Kind == PoolKind::Max ? -std::numeric_limits<double>::infinity() : 0.0;
                int64_t best = -1, count = 0;
                std::fill(k_idx.begin(), k_idx.end(), 0);
                for (int64_t k = 0; k < k_size; ++k) {
                    int64_t off = 0;
                    bool inside = true, in_padded = true;
                    int64_t col_off = 0, col_stride = 1;
                    for (size_t d = 0; d < S; ++d) {
                        int64_t pos = o_idx[d] * strides[d] - pads.begin[d] + k_idx[d] * dilations[d];
                        inside &= pos >= 0 && pos < in_spatial[d];
                        in_padded &= pos >= -pads.begin[d] && pos < in_spatial[d] + pads.end[d];
                        off += pos * in_strides[d];
                        col_off += pos * col_stride;
                        col_stride *= in_spatial[d];
                    }
                    if (in_padded && (inside || include_pad)) ++count;
                    if (inside) {
                        double v = static_cast<double>(px[c * in_size + off]);
                        if constexpr (Kind == PoolKind::Max) {
                            if (v > acc || best < 0 || std::isnan(v)) {  // NaN anywhere in the window wins, as in PyTorch
                                acc = v;
                                best = c * in_size + (col_major ? col_off : off);
                            }
                        } else if constexpr (Kind == PoolKind::Average) {
                            acc += v;
                        } else {
                            acc += std::pow(std::fabs(v), p);
                        }
                    }
                    for (int64_t d = static_cast<int64_t>(S) - 1; d >= 0; --d) {
                        if (++k_idx[d] < kernel[d]) break;
                        k_idx[d] = 0;
                    }
                }
                if constexpr (Kind == PoolKind::Average) acc = count ? acc / static_cast<double>(count) : 0.0;
                if constexpr (Kind == PoolKind::Lp) acc = std::pow(acc, 1.0 / p);
                po[c * out_size + o] = static_cast<T>(acc);
                indices.data<int64_t>()[c * out_size + o] = best;
            }
            for (int64_t d = static_cast<int64_t>(S) - 1; d >= 0; --d) {
                if (++o_idx[d] < out_spatial[d]) break;
                o_idx[d] = 0;
            }
        }
        return out;
    });
    if (Kind == PoolKind::Max && ctx.numOutputs() > 1 && !ctx.node.outputs[1].empty()) return {y, indices};
    return {y};
}

template <PoolKind Kind>
std::vector<Tensor> globalPool(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 3, [&] { return "input must have rank >= 3, got " + x.summary(); });
    const int64_t NC = x.dims()[0] * x.dims()[1];
    const int64_t inner = NC ? x.numel() / NC : 0;
    Dims out_dims(x.rank(), 1);
    out_dims[0] = x.dims()[0];
    out_dims[1] = x.dims()[1];
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        for (int64_t c = 0; c < NC; ++c) {
            double acc = Kind == PoolKind::Max ? -std::numeric_limits<double>::infinity() : 0.0;
            for (int64_t i = 0; i < inner; ++i) {
                double v = static_cast<double>(px[c * inner + i]);
                acc = Kind == PoolKind::Max ? (v > acc || std::isnan(v) ? v : acc) : acc + v;
            }
            if (Kind == PoolKind::Average) acc /= static_cast<double>(inner);
            out.data<T>()[c] = static_cast<T>(acc);
        }
        return out;
    })};
}

}  // namespace

void registerPoolKernels(KernelRegistry& r) {
    r.add("MaxPool", pool<PoolKind::Max>);
    r.add("AveragePool", pool<PoolKind::Average>);
    r.add("LpPool", pool<PoolKind::Lp>);
    r.add("GlobalMaxPool", globalPool<PoolKind::Max>);
    r.add("GlobalAveragePool", globalPool<PoolKind::Average>);
}

}  // namespace kiln
