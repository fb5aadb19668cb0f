#include "runtime/accuracy.h"

#include <cmath>

namespace kiln {

ErrorStats compareOutputs(const Tensor& got, const Tensor& want, const std::string& name) {
    check(got.dtype() == want.dtype() && got.dims() == want.dims(), [&] { return "output '" + name + "' is " + got.summary() + ", expected " + want.summary(); });
    ErrorStats s;
    double diff2 = 0, want2 = 0, got2 = 0, dot = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
        const double g = got.scalarAt(i), w = want.scalarAt(i);
        if (std::isnan(g) || std::isnan(w)) {
            s.nan_mismatch |= std::isnan(g) != std::isnan(w);
            continue;
        }
        const double d = g == w ? 0.0 : g - w;  // equal infinities differ by 0
        s.max_abs = std::max(s.max_abs, std::fabs(d));
        diff2 += d * d;
        want2 += w * w;
        got2 += g * g;
        dot += g * w;
    }
    s.rel_l2 = want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
    s.cosine = (got2 > 0 && want2 > 0) ? dot / std::sqrt(got2 * want2) : (got2 == want2 ? 1.0 : 0.0);
    return s;
}

double topKAgreement(const Tensor& got, const Tensor& want, int64_t k, const std::string& name) {
    check(got.dtype() == want.dtype() && got.dims() == want.dims() && got.rank() >= 1, [&] { return "output '" + name + "' is " + got.summary() + ", expected " + want.summary(); });
    const int64_t len = got.dims().back();
    const int64_t rows = len ? got.numel() / len : 0;
    if (rows == 0) return 1.0;
    int64_t agree = 0;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t top = 0;
        for (int64_t j = 1; j < len; ++j)
            if (got.scalarAt(r * len + j) > got.scalarAt(r * len + top)) top = j;
        // Rank of the candidate's top-1 in the golden row: how many golden values beat it.
        const double v = want.scalarAt(r * len + top);
        int64_t better = 0;
        for (int64_t j = 0; j < len; ++j) better += want.scalarAt(r * len + j) > v;
        agree += better < k;
    }
    return static_cast<double>(agree) / static_cast<double>(rows);
}

}  // namespace kiln
