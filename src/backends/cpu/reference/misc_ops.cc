// Ops that fit no family of their own: Det (LU with partial pivoting, in double), MaxUnpool
// (values scattered to the positions MaxPool's indices name) and Unique (sorted or in order of
// first occurrence, flattened or along an axis, with indices, inverse indices and counts).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> det(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() >= 2 && x.dims()[x.rank() - 1] == x.dims()[x.rank() - 2], [&] { return "input must be [..., M, M], got " + x.summary(); });
    const int64_t n = x.dims().back(), count = x.numel() / std::max<int64_t>(n * n, 1);
    Tensor out(x.dtype(), Dims(x.dims().begin(), x.dims().end() - 2));
    std::vector<double> a(static_cast<size_t>(n * n));
    dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t b = 0; b < count; ++b) {
            for (int64_t i = 0; i < n * n; ++i) a[i] = x.scalarAt(b * n * n + i);
            double d = 1;
            for (int64_t c = 0; c < n && d != 0; ++c) {
                int64_t p = c;
                for (int64_t r = c + 1; r < n; ++r)
                    if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
                if (a[p * n + c] == 0) {
                    d = 0;
                    break;
                }
                if (p != c) {
                    for (int64_t k = 0; k < n; ++k) std::swap(a[p * n + k], a[c * n + k]);
                    d = -d;
                }
                d *= a[c * n + c];
                for (int64_t r = c + 1; r < n; ++r) {
                    const double f = a[r * n + c] / a[c * n + c];
                    for (int64_t k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
                }
            }
            out.data<T>()[b] = static_cast<T>(d);
        }
    });
    return {out};
}

// MaxUnpool(X, I [, output_shape]): zeros of the unpooled shape with X's values at I, indices
// into the whole flattened output, as MaxPool returns them.
std::vector<Tensor> maxUnpool(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& idx = ctx.input(1);
    ctx.require(idx.dims() == x.dims(), [&] { return "indices " + idx.summary() + " must have the input's shape " + x.summary(); });
    ctx.require(x.rank() >= 3, [&] { return "input must be [N, C, spatial...], got " + x.summary(); });
    const size_t sp = x.rank() - 2;
    const auto kernel = ctx.attrs().getInts("kernel_shape");
    ctx.require(kernel.size() == sp, "kernel_shape must have one value per spatial dim");
    const auto strides = ctx.attrs().getInts("strides", Dims(sp, 1));
    const auto pads = ctx.attrs().getInts("pads", Dims(2 * sp, 0));
    ctx.require(strides.size() == sp && pads.size() == 2 * sp, "strides and pads must match the spatial dims");
    Dims out_dims = x.dims();
    for (size_t d = 0; d < sp; ++d) out_dims[2 + d] = (x.dims()[2 + d] - 1) * strides[d] + kernel[d] - pads[d] - pads[sp + d];
    // Indices count in the inferred shape; a larger output_shape keeps each at its position
    // (the pooled input's padding is what it adds).
    const Dims inferred = out_dims;
    if (ctx.hasInput(2)) {
        out_dims = ctx.input(2).toInt64Vector();
        ctx.require(out_dims.size() == x.rank(), "output_shape must have the input's rank");
        for (size_t d = 0; d < x.rank(); ++d) ctx.require(out_dims[d] >= inferred[d], [&] { return "output_shape is smaller than the unpooled shape " + dimsToString(inferred); });
    }
    Tensor out(x.dtype(), out_dims);
    const int64_t total = numElements(inferred);
    const size_t es = dtypeSize(x.dtype());
    for (int64_t i = 0; i < x.numel(); ++i) {
        int64_t at = static_cast<int64_t>(idx.scalarAt(i));
        ctx.require(at >= 0 && at < total, [&] { return "index " + std::to_string(at) + " is outside the unpooled " + dimsToString(inferred); });
        int64_t place = 0, stride = 1;
        for (size_t d = x.rank(); d-- > 0;) {
            place += (at % inferred[d]) * stride;
            at /= inferred[d];
            stride *= out_dims[d];
        }
        std::memcpy(out.raw() + place * es, x.raw() + i * es, es);
    }
    return {out};
}

// Unique(X) {axis?, sorted}: the distinct elements (or slices along axis).
std::vector<Tensor> unique(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const bool sorted = ctx.attrs().getInt("sorted", 1) != 0;
    const bool has_axis = ctx.attrs().has("axis");
    const int64_t axis = has_axis ? normalizeAxis(ctx.attrs().getInt("axis"), static_cast<int64_t>(x.rank()), ctx) : 0;
    int64_t outer = 1, len = x.numel(), inner = 1;
    if (has_axis) {
        len = x.dims()[axis];
        for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
        for (size_t d = static_cast<size_t>(axis) + 1; d < x.rank(); ++d) inner *= x.dims()[d];
    }
    // Slice s as a vector of values (outer x inner of them), compared lexicographically.
    auto slice = [&](int64_t s) {
        std::vector<double> v;
        v.reserve(static_cast<size_t>(outer * inner));
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t k = 0; k < inner; ++k) v.push_back(x.scalarAt((o * len + s) * inner + k));
        return v;
    };
    std::map<std::vector<double>, int64_t> first;  // slice -> first occurrence
    std::vector<int64_t> order;
    std::vector<std::vector<double>> keys(static_cast<size_t>(len));
    for (int64_t s = 0; s < len; ++s) {
        keys[s] = slice(s);
        if (first.emplace(keys[s], s).second) order.push_back(s);
    }
    if (sorted) std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
    std::map<std::vector<double>, int64_t> position;
    for (size_t u = 0; u < order.size(); ++u) position[keys[order[u]]] = static_cast<int64_t>(u);
    const int64_t U = static_cast<int64_t>(order.size());
    std::vector<int64_t> inverse(static_cast<size_t>(len)), counts(static_cast<size_t>(U), 0);
    for (int64_t s = 0; s < len; ++s) inverse[s] = position[keys[s]], ++counts[inverse[s]];
    Dims y_dims = has_axis ? x.dims() : Dims{U};
    if (has_axis) y_dims[axis] = U;
    Tensor y(x.dtype(), y_dims);
    const size_t es = dtypeSize(x.dtype());
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t u = 0; u < U; ++u)
            std::memcpy(y.raw() + ((o * U + u) * inner) * es, x.raw() + ((o * len + order[u]) * inner) * es, static_cast<size_t>(inner) * es);
    return {y, Tensor::fromVector<int64_t>({U}, order), Tensor::fromVector<int64_t>({len}, inverse), Tensor::fromVector<int64_t>({U}, counts)};
}

}  // namespace

void registerMiscKernels(KernelRegistry& r) {
    r.add("Det", det);
    r.add("MaxUnpool", maxUnpool);
    r.add("Unique", unique);
}

}  // namespace kiln
