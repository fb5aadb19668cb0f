// Softmax, LogSoftmax, Hardmax. Before opset 13 these flatten the input to 2-D at `axis`
// (default 1); from opset 13 they work along the single axis `axis` (default -1).
#include <cmath>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class SoftmaxKind { Softmax, LogSoftmax, Hardmax };

template <SoftmaxKind Kind>
std::vector<Tensor> softmax(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const bool legacy = ctx.opset < 13;
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", legacy ? 1 : -1), rank, ctx);
    // View as [outer, len, inner] and reduce over len.
    int64_t outer = 1, len = 1, inner = 1;
    for (int64_t i = 0; i < rank; ++i) {
        if (i < axis) outer *= x.dims()[i];
        else if (legacy || i == axis) len *= x.dims()[i];
        else inner *= x.dims()[i];
    }
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t in = 0; in < inner; ++in) {
                auto at = [&](int64_t j) { return (o * len + j) * inner + in; };
                double mx = -INFINITY;
                int64_t arg = 0;
                for (int64_t j = 0; j < len; ++j) {
                    double v = static_cast<double>(px[at(j)]);
                    if (v > mx) {
                        mx = v;
                        arg = j;
                    }
                }
                if constexpr (Kind == SoftmaxKind::Hardmax) {
                    for (int64_t j = 0; j < len; ++j) po[at(j)] = static_cast<T>(j == arg ? 1.0 : 0.0);
                } else {
                    double sum = 0;
                    for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(px[at(j)]) - mx);
                    for (int64_t j = 0; j < len; ++j) {
                        double shifted = static_cast<double>(px[at(j)]) - mx;
                        po[at(j)] = static_cast<T>(Kind == SoftmaxKind::Softmax ? std::exp(shifted) / sum : shifted - std::log(sum));
                    }
                }
            }
        return out;
    })};
}

}  // namespace

void registerSoftmaxKernels(KernelRegistry& r) {
    r.add("Softmax", softmax<SoftmaxKind::Softmax>);
    r.add("LogSoftmax", softmax<SoftmaxKind::LogSoftmax>);
    r.add("Hardmax", softmax<SoftmaxKind::Hardmax>);
}

}  // namespace kiln
