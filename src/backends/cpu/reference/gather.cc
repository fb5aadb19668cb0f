// Indexing ops: Gather, GatherElements, GatherND, ScatterND, ScatterElements (Scatter).
// Negative indices count from the end; out-of-range indices are an error, not a crash.
#include <cstring>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

int64_t checkedIndex(int64_t idx, int64_t dim, const KernelContext& ctx) {
    int64_t i = idx < 0 ? idx + dim : idx;
    // The message is built only on failure: this runs once per index.
    ctx.require(i >= 0 && i < dim, [&] { return "index " + std::to_string(idx) + " is out of range for a dimension of size " + std::to_string(dim); });
    return i;
}

std::vector<Tensor> gather(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), static_cast<int64_t>(x.rank()), ctx);
    auto indices = ind.toInt64Vector();
    Dims out_dims(x.dims().begin(), x.dims().begin() + axis);
    out_dims.insert(out_dims.end(), ind.dims().begin(), ind.dims().end());
    out_dims.insert(out_dims.end(), x.dims().begin() + axis + 1, x.dims().end());
    int64_t outer = 1, inner = static_cast<int64_t>(dtypeSize(x.dtype()));
    for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.rank(); ++d) inner *= x.dims()[d];
    const int64_t len = x.dims()[axis], n = static_cast<int64_t>(indices.size());
    Tensor out(x.dtype(), out_dims);
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < n; ++j) {
            int64_t src = checkedIndex(indices[j], len, ctx);
            std::memcpy(out.raw() + (o * n + j) * inner, x.raw() + (o * len + src) * inner, static_cast<size_t>(inner));
        }
    return {out};
}

std::vector<Tensor> gatherElements(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    ctx.require(ind.rank() == x.rank(), "indices must have the rank of data");
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), static_cast<int64_t>(x.rank()), ctx);
    auto indices = ind.toInt64Vector();
    const Dims xs = stridesOf(x.dims());
    const size_t es = dtypeSize(x.dtype());
    Tensor out(x.dtype(), ind.dims());
    Dims idx(ind.rank(), 0);
    for (int64_t i = 0; i < ind.numel(); ++i) {
        int64_t off = 0;
        for (size_t d = 0; d < ind.rank(); ++d)
            off += (static_cast<int64_t>(d) == axis ? checkedIndex(indices[i], x.dims()[d], ctx) : idx[d]) * xs[d];
        std::memcpy(out.raw() + i * es, x.raw() + off * es, es);
        for (int64_t d = static_cast<int64_t>(ind.rank()) - 1; d >= 0; --d) {
            if (++idx[d] < ind.dims()[d]) break;
            idx[d] = 0;
        }
    }
    return {out};
}

std::vector<Tensor> gatherND(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const int64_t b = ctx.attrs().getInt("batch_dims", 0);
    const int64_t q = static_cast<int64_t>(ind.rank()), r = static_cast<int64_t>(x.rank());
    const int64_t k = ind.dims().back();
    ctx.require(q >= 1 && k >= 1 && b + k <= r, "index tuple length does not fit the data rank");
    auto indices = ind.toInt64Vector();
    Dims out_dims(ind.dims().begin(), ind.dims().end() - 1);
    out_dims.insert(out_dims.end(), x.dims().begin() + b + k, x.dims().end());
    int64_t batch = 1, slice = static_cast<int64_t>(dtypeSize(x.dtype()));
    for (int64_t d = 0; d < b; ++d) batch *= x.dims()[d];
    for (int64_t d = b + k; d < r; ++d) slice *= x.dims()[d];
    const int64_t tuples = numElements(Dims(ind.dims().begin(), ind.dims().end() - 1));
    const int64_t per_batch = batch ? tuples / batch : 0;
    const Dims xs = stridesOf(x.dims());
    const int64_t batch_stride = b > 0 ? xs[b - 1] : 0;
    Tensor out(x.dtype(), out_dims);
    const size_t es = dtypeSize(x.dtype());
    for (int64_t t = 0; t < tuples; ++t) {
        int64_t off = (per_batch ? t / per_batch : 0) * batch_stride;
        for (int64_t j = 0; j < k; ++j) off += checkedIndex(indices[t * k + j], x.dims()[b + j], ctx) * xs[b + j];
        std::memcpy(out.raw() + t * slice, x.raw() + off * static_cast<int64_t>(es), static_cast<size_t>(slice));
    }
    return {out};
}

// Combines an update into the destination according to the `reduction` attribute.
template <typename T>
void combine(T& dst, T src, const std::string& reduction) {
    if (reduction == "add") dst = static_cast<T>(static_cast<double>(dst) + static_cast<double>(src));
    else if (reduction == "mul") dst = static_cast<T>(static_cast<double>(dst) * static_cast<double>(src));
    else if (reduction == "max") dst = static_cast<double>(src) > static_cast<double>(dst) ? src : dst;
    else if (reduction == "min") dst = static_cast<double>(src) < static_cast<double>(dst) ? src : dst;
    else dst = src;
}

std::vector<Tensor> scatterND(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const Tensor& upd = ctx.input(2);
    const std::string reduction = ctx.attrs().getString("reduction", "none");
    const int64_t k = ind.dims().back();
    ctx.require(k <= static_cast<int64_t>(x.rank()), "index tuple longer than data rank");
    auto indices = ind.toInt64Vector();
    const int64_t tuples = ind.numel() / std::max<int64_t>(k, 1);
    int64_t slice = 1;
    for (size_t d = static_cast<size_t>(k); d < x.rank(); ++d) slice *= x.dims()[d];
    ctx.require(upd.numel() == tuples * slice, [&] { return "updates " + upd.summary() + " do not match indices " + ind.summary(); });
    const Dims xs = stridesOf(x.dims());
    Tensor out = x.clone();
    dispatchDType(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t t = 0; t < tuples; ++t) {
            int64_t off = 0;
            for (int64_t j = 0; j < k; ++j) off += checkedIndex(indices[t * k + j], x.dims()[j], ctx) * xs[j];
            for (int64_t s = 0; s < slice; ++s) combine<T>(out.data<T>()[off + s], upd.data<T>()[t * slice + s], reduction);
        }
    });
    return {out};
}

std::vector<Tensor> scatterElements(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& ind = ctx.input(1);
    const Tensor& upd = ctx.input(2);
    ctx.require(ind.dims() == upd.dims() && ind.rank() == x.rank(), "indices and updates must have equal shapes and the data's rank");
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 0), static_cast<int64_t>(x.rank()), ctx);
    const std::string reduction = ctx.attrs().getString("reduction", "none");
    auto indices = ind.toInt64Vector();
    const Dims xs = stridesOf(x.dims());
    Tensor out = x.clone();
    dispatchDType(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Dims idx(ind.rank(), 0);
        for (int64_t i = 0; i < ind.numel(); ++i) {
            int64_t off = 0;
            for (size_t d = 0; d < ind.rank(); ++d)
                off += (static_cast<int64_t>(d) == axis ? checkedIndex(indices[i], x.dims()[d], ctx) : idx[d]) * xs[d];
            combine<T>(out.data<T>()[off], upd.data<T>()[i], reduction);
            for (int64_t d = static_cast<int64_t>(ind.rank()) - 1; d >= 0; --d) {
                if (++idx[d] < ind.dims()[d]) break;
                idx[d] = 0;
            }
        }
    });
    return {out};
}

}  // namespace

void registerGatherKernels(KernelRegistry& r) {
    r.add("Gather", gather);
    r.add("GatherElements", gatherElements);
    r.add("GatherND", gatherND);
    r.add("ScatterND", scatterND);
    r.add("ScatterElements", scatterElements);
    r.add("Scatter", scatterElements);
}

}  // namespace kiln
