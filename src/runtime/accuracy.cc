#include "runtime/accuracy.h"

#include <cmath>

namespace kiln {

ErrorStats compareOutputs(const Tensor& got, const Tensor& want, const std::string& name) {
    check(got.dtype() == want.dtype() && got.dims() == want.dims(), "output '" + name + "' is " + got.summary() + ", expected " + want.summary());
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

}  // namespace kiln
