// Conv and ConvTranspose for any number of spatial dims, with groups, strides, dilations
// and padding. Direct loops accumulating in double: slow, simple, exact enough to be the
// reference the fast kernels are checked against.
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

struct ConvGeometry {
    size_t spatial = 0;
    std::vector<int64_t> kernel, strides, dilations;
    SpatialPads pads;
};

// All multi-indices of `dims`, row-major, as a flat array of `dims.size()` entries each.
std::vector<int64_t> multiIndices(const Dims& dims) {
    const int64_t n = numElements(dims);
    std::vector<int64_t> out(static_cast<size_t>(n) * dims.size());
    Dims idx(dims.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
        std::copy(idx.begin(), idx.end(), out.begin() + i * static_cast<int64_t>(dims.size()));
        for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
            if (++idx[d] < dims[d]) break;
            idx[d] = 0;
        }
    }
    return out;
}

ConvGeometry convGeometry(const KernelContext& ctx, const Tensor& x, const Tensor& w, bool transpose) {
    ctx.require(x.rank() >= 3, [&] { return "input must have rank >= 3 (N, C, spatial...), got " + x.summary(); });
    ctx.require(w.rank() == x.rank(), [&] { return "weight rank " + std::to_string(w.rank()) + " does not match input rank " + std::to_string(x.rank()); });
    ConvGeometry g;
    g.spatial = x.rank() - 2;
    g.kernel = ctx.attrs().getInts("kernel_shape", Dims(w.dims().begin() + 2, w.dims().end()));
    g.strides = ctx.attrs().getInts("strides", Dims(g.spatial, 1));
    g.dilations = ctx.attrs().getInts("dilations", Dims(g.spatial, 1));
    ctx.require(g.kernel.size() == g.spatial && g.strides.size() == g.spatial && g.dilations.size() == g.spatial,
                "kernel_shape/strides/dilations must have one value per spatial dim");
    if (!transpose) g.pads = resolvePads(ctx, Dims(x.dims().begin() + 2, x.dims().end()), g.kernel, g.strides, g.dilations);
    return g;
}

}  // namespace

std::vector<Tensor> convKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.optionalInput(2);
    ConvGeometry g = convGeometry(ctx, x, w, false);
    const int64_t group = ctx.attrs().getInt("group", 1);
    const int64_t N = x.dims()[0], C = x.dims()[1], M = w.dims()[0];
    ctx.require(group > 0 && C % group == 0 && M % group == 0 && w.dims()[1] * group == C,
                [&] { return "channels " + std::to_string(C) + " do not match weight " + w.summary() + " with group " + std::to_string(group); });
    Dims out_spatial(g.spatial);
    for (size_t i = 0; i < g.spatial; ++i) {
        int64_t eff = (g.kernel[i] - 1) * g.dilations[i] + 1;
        out_spatial[i] = (x.dims()[2 + i] + g.pads.begin[i] + g.pads.end[i] - eff) / g.strides[i] + 1;
        ctx.require(out_spatial[i] > 0, [&] { return "kernel larger than padded input in spatial dim " + std::to_string(i); });
    }
    Dims out_dims = {N, M};
    out_dims.insert(out_dims.end(), out_spatial.begin(), out_spatial.end());
    const Dims in_spatial(x.dims().begin() + 2, x.dims().end());
    const Dims in_strides = stridesOf(in_spatial);
    const int64_t in_size = numElements(in_spatial), out_size = numElements(out_spatial), k_size = numElements(g.kernel);
    const auto out_idx = multiIndices(out_spatial);
    const auto k_idx = multiIndices(g.kernel);
    const int64_t cpg = C / group, mpg = M / group;
    const size_t S = g.spatial;

    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), out_dims);
        const T* px = x.data<T>();
        const T* pw = w.data<T>();
        T* po = out.data<T>();
        std::vector<int64_t> in_off(static_cast<size_t>(k_size));
        for (int64_t o = 0; o < out_size; ++o) {
            // Input offset for each kernel tap at this output position, -1 where it is padding.
            for (int64_t k = 0; k < k_size; ++k) {
                int64_t off = 0;
                for (size_t d = 0; d < S; ++d) {
                    int64_t pos = out_idx[o * S + d] * g.strides[d] - g.pads.begin[d] + k_idx[k * S + d] * g.dilations[d];
                    if (pos < 0 || pos >= in_spatial[d]) {
                        off = -1;
                        break;
                    }
                    off += pos * in_strides[d];
                }
                in_off[k] = off;
            }
            for (int64_t n = 0; n < N; ++n)
                for (int64_t m = 0; m < M; ++m) {
                    const int64_t grp = m / mpg;
                    double acc = b ? b->scalarAt(m) : 0.0;
                    for (int64_t c = 0; c < cpg; ++c) {
                        const T* xc = px + (n * C + grp * cpg + c) * in_size;
                        const T* wc = pw + (m * cpg + c) * k_size;
                        for (int64_t k = 0; k < k_size; ++k)
                            if (in_off[k] >= 0) acc += static_cast<double>(xc[in_off[k]]) * static_cast<double>(wc[k]);
                    }
                    po[(n * M + m) * out_size + o] = static_cast<T>(acc);
                }
        }
        return out;
    })};
}

namespace {

}  // namespace

DeconvGeometry deconvGeometry(const KernelContext& ctx, const Dims& x_dims, const Dims& w_dims) {
    // Geometry reads only dims: stand-ins of no bytes carry them.
    const Tensor x = Tensor::alias(DType::F32, x_dims, nullptr, 0), w = Tensor::alias(DType::F32, w_dims, nullptr, 0);
    const ConvGeometry cg = convGeometry(ctx, x, w, true);
    DeconvGeometry g;
    const size_t S = cg.spatial;
    g.kernel = cg.kernel, g.strides = cg.strides, g.dilations = cg.dilations;
    g.group = ctx.attrs().getInt("group", 1);
    const int64_t C = x.dims()[1];
    ctx.require(g.group > 0 && w.dims()[0] == C && C % g.group == 0, [&] { return "weight " + w.summary() + " does not match input channels " + std::to_string(C); });
    g.M = w.dims()[1] * g.group;
    auto output_padding = ctx.attrs().getInts("output_padding", Dims(S, 0));
    auto output_shape = ctx.attrs().getInts("output_shape", {});
    std::string auto_pad = ctx.attrs().getString("auto_pad", "NOTSET");
    auto pads = ctx.attrs().getInts("pads", Dims(2 * S, 0));
    ctx.require(output_padding.size() == S && pads.size() == 2 * S, "output_padding needs one value and pads two per spatial dim");
    g.out_spatial.resize(S);
    g.pad_begin.resize(S);
    g.pad_end.resize(S);
    for (size_t i = 0; i < S; ++i) {
        const int64_t in = x.dims()[2 + i];
        const int64_t full = g.strides[i] * (in - 1) + output_padding[i] + (g.kernel[i] - 1) * g.dilations[i] + 1;
        if (!output_shape.empty() || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
            int64_t target = output_shape.empty() ? in * g.strides[i] : output_shape[output_shape.size() - S + i];
            int64_t total = full - target;
            g.out_spatial[i] = target;
            g.pad_begin[i] = auto_pad == "SAME_LOWER" ? total - total / 2 : total / 2;
        } else {
            g.pad_begin[i] = auto_pad == "VALID" ? 0 : pads[i];
            g.out_spatial[i] = full - (auto_pad == "VALID" ? 0 : pads[i] + pads[i + S]);
        }
        g.pad_end[i] = full - output_padding[i] - g.out_spatial[i] - g.pad_begin[i];
        ctx.require(g.out_spatial[i] > 0, "output spatial size must be positive");
    }
    return g;
}

namespace {

std::vector<Tensor> convTranspose(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.optionalInput(2);
    const DeconvGeometry g = deconvGeometry(ctx, x.dims(), w.dims());
    const size_t S = g.kernel.size();
    const int64_t group = g.group, M = g.M;
    const int64_t N = x.dims()[0], C = x.dims()[1];
    const int64_t mpg = w.dims()[1], cpg = C / group;
    const Dims& out_spatial = g.out_spatial;
    const std::vector<int64_t>& pad_begin = g.pad_begin;
    Dims out_dims = {N, M};
    out_dims.insert(out_dims.end(), out_spatial.begin(), out_spatial.end());
    const Dims in_spatial(x.dims().begin() + 2, x.dims().end());
    const Dims out_strides = stridesOf(out_spatial);
    const int64_t in_size = numElements(in_spatial), out_size = numElements(out_spatial), k_size = numElements(g.kernel);
    const auto in_idx = multiIndices(in_spatial);
    const auto k_idx = multiIndices(g.kernel);

    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::vector<double> acc(static_cast<size_t>(numElements(out_dims)), 0.0);
        const T* px = x.data<T>();
        const T* pw = w.data<T>();
        for (int64_t i = 0; i < in_size; ++i)
            for (int64_t k = 0; k < k_size; ++k) {
                int64_t off = 0;
                for (size_t d = 0; d < S && off >= 0; ++d) {
                    int64_t pos = in_idx[i * S + d] * g.strides[d] - pad_begin[d] + k_idx[k * S + d] * g.dilations[d];
                    off = (pos < 0 || pos >= out_spatial[d]) ? -1 : off + pos * out_strides[d];
                }
                if (off < 0) continue;
                for (int64_t n = 0; n < N; ++n)
                    for (int64_t c = 0; c < C; ++c) {
                        const double xv = static_cast<double>(px[(n * C + c) * in_size + i]);
                        const int64_t grp = c / cpg;
                        for (int64_t m = 0; m < mpg; ++m)
                            acc[(n * M + grp * mpg + m) * out_size + off] += xv * static_cast<double>(pw[(c * mpg + m) * k_size + k]);
                    }
            }
        Tensor out(x.dtype(), out_dims);
        T* po = out.data<T>();
        for (int64_t n = 0; n < N; ++n)
            for (int64_t m = 0; m < M; ++m)
                for (int64_t o = 0; o < out_size; ++o) {
                    size_t idx = static_cast<size_t>((n * M + m) * out_size + o);
                    po[idx] = static_cast<T>(acc[idx] + (b ? b->scalarAt(m) : 0.0));
                }
        return out;
    })};
}

}  // namespace

void registerConvKernels(KernelRegistry& r) {
    r.add("Conv", convKernel);
    r.add("ConvTranspose", convTranspose);
}

}  // namespace kiln
