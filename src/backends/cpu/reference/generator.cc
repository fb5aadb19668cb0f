// Ops that create tensors: Constant, ConstantOfShape, Range, EyeLike, OneHot.
#include <cmath>
#include <cstring>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> constant(const KernelContext& ctx) {
    const Attributes& a = ctx.attrs();
    if (a.has("value")) return {a.getTensor("value")};
    if (a.has("value_float")) return {Tensor::scalar<float>(a.getFloat("value_float", 0))};
    if (a.has("value_int")) return {Tensor::scalar<int64_t>(a.getInt("value_int"))};
    if (a.has("value_floats")) {
        auto v = a.getFloats("value_floats");
        return {Tensor::fromVector<float>({static_cast<int64_t>(v.size())}, v)};
    }
    if (a.has("value_ints")) {
        auto v = a.getInts("value_ints");
        return {Tensor::fromVector<int64_t>({static_cast<int64_t>(v.size())}, v)};
    }
    ctx.fail("needs a value, value_float(s) or value_int(s) attribute (string and sparse constants are not supported)");
}

std::vector<Tensor> constantOfShape(const KernelContext& ctx) {
    Dims dims = ctx.input(0).toInt64Vector();
    Tensor fill = ctx.attrs().has("value") ? ctx.attrs().getTensor("value") : Tensor::scalar<float>(0.0f);
    ctx.require(fill.numel() == 1, "value must hold one element");
    Tensor out(fill.dtype(), dims);
    const size_t es = dtypeSize(fill.dtype());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(out.raw() + i * es, fill.raw(), es);
    return {out};
}

std::vector<Tensor> range(const KernelContext& ctx) {
    const Tensor& start = ctx.input(0);
    const double s = start.scalarAt(0), limit = ctx.input(1).scalarAt(0), delta = ctx.input(2).scalarAt(0);
    ctx.require(delta != 0, "delta cannot be 0");
    const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((limit - s) / delta)));
    return {dispatchNumeric(start.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(start.dtype(), {n});
        // Accumulate in T, like the ONNX reference, so integer ranges are exact.
        T v = static_cast<T>(s);
        const T d = static_cast<T>(delta);
        for (int64_t i = 0; i < n; ++i) {
            out.data<T>()[i] = v;
            v = static_cast<T>(v + d);
        }
        return out;
    })};
}

std::vector<Tensor> eyeLike(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() == 2, "input must be 2-D");
    DType dtype = ctx.attrs().has("dtype") ? parseDType(ctx.attrs().getString("dtype", "")) : x.dtype();
    const int64_t k = ctx.attrs().getInt("k", 0);
    Tensor out(dtype, x.dims());
    dispatchDType(dtype, ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t r = 0; r < x.dims()[0]; ++r) {
            int64_t c = r + k;
            if (c >= 0 && c < x.dims()[1]) out.data<T>()[r * x.dims()[1] + c] = static_cast<T>(1);
        }
    });
    return {out};
}

std::vector<Tensor> oneHot(const KernelContext& ctx) {
    const Tensor& ind = ctx.input(0);
    const int64_t depth = static_cast<int64_t>(ctx.input(1).scalarAt(0));
    const Tensor& values = ctx.input(2);
    ctx.require(values.numel() == 2, "values must hold [off, on]");
    ctx.require(depth > 0, "depth must be positive");
    const int64_t out_rank = static_cast<int64_t>(ind.rank()) + 1;
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", -1), out_rank, ctx);
    Dims out_dims = ind.dims();
    out_dims.insert(out_dims.begin() + axis, depth);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= ind.dims()[d];
    for (size_t d = static_cast<size_t>(axis); d < ind.rank(); ++d) inner *= ind.dims()[d];
    Tensor out(values.dtype(), out_dims);
    const size_t es = dtypeSize(values.dtype());
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < depth; ++j)
            for (int64_t in = 0; in < inner; ++in) {
                int64_t idx = static_cast<int64_t>(ind.scalarAt(o * inner + in));
                if (idx < 0) idx += depth;
                std::memcpy(out.raw() + ((o * depth + j) * inner + in) * es, values.raw() + (idx == j ? es : 0), es);
            }
    return {out};
}

}  // namespace

void registerGeneratorKernels(KernelRegistry& r) {
    r.add("Constant", constant);
    r.add("ConstantOfShape", constantOfShape);
    r.add("Range", range);
    r.add("EyeLike", eyeLike);
    r.add("OneHot", oneHot);
}

}  // namespace kiln
