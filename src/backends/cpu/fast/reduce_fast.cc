// Fast f32 reductions (ReduceSum, ReduceMean, ReduceSumSquare, ReduceMax, ReduceMin) over one
// contiguous range of axes, seen as [outer, R, inner]: rows summed in double lanes that
// vectorize (the reference's accuracy), or R rows of `inner` folded into one. The reference
// walks a table of offsets per element; a global mean over [1, 1024, 7, 7] took it 0.7 ms.
// Other axis sets, dtypes and the empty-axes no-op fall back to the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/fast/max_or_nan.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class Fold { Sum, Mean, SumSquare, Max, Min };

Fold foldOf(const std::string& op) {
    if (op == "ReduceSum") return Fold::Sum;
    if (op == "ReduceMean") return Fold::Mean;
    if (op == "ReduceSumSquare") return Fold::SumSquare;
    if (op == "ReduceMax") return Fold::Max;
    return Fold::Min;
}

inline float minOrNan(float a, float b) { return (b < a || b != b) ? b : a; }

// One row of `len` contiguous floats.
__attribute__((target_clones("avx512f", "avx2", "default"))) double foldRow(const float* x, int64_t len, Fold f) {
    if (f == Fold::Max || f == Fold::Min) {
        float a = x[0];
        for (int64_t j = 1; j < len; ++j) a = f == Fold::Max ? maxOrNan(a, x[j]) : minOrNan(a, x[j]);
        return a;
    }
    double s = 0;
    if (f == Fold::SumSquare) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < len; ++j) s += static_cast<double>(x[j]) * x[j];
    } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < len; ++j) s += x[j];
    }
    return s;
}

// acc[i] op= x[i] over `inner` lanes (acc in double for the sums, in float for max and min).
__attribute__((target_clones("avx512f", "avx2", "default"))) void foldInto(double* acc, float* ext, const float* x, int64_t inner, Fold f) {
    switch (f) {
        case Fold::Max:
            for (int64_t i = 0; i < inner; ++i) ext[i] = maxOrNan(ext[i], x[i]);
            break;
        case Fold::Min:
            for (int64_t i = 0; i < inner; ++i) ext[i] = minOrNan(ext[i], x[i]);
            break;
        case Fold::SumSquare:
            for (int64_t i = 0; i < inner; ++i) acc[i] += static_cast<double>(x[i]) * x[i];
            break;
        default:
            for (int64_t i = 0; i < inner; ++i) acc[i] += x[i];
    }
}

std::vector<Tensor> fastReduce(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const std::vector<int64_t> axes = intsFromInputOrAttr(ctx, 1, "axes");
    if (x.dtype() != DType::F32 || x.numel() == 0 || rank == 0 || (axes.empty() && ctx.attrs().getInt("noop_with_empty_axes", 0) != 0))
        return referenceFallback(ctx);
    std::vector<bool> reduced(static_cast<size_t>(rank), axes.empty());
    for (int64_t a : axes) reduced[normalizeAxis(a, rank, ctx)] = true;
    const int64_t lo = std::find(reduced.begin(), reduced.end(), true) - reduced.begin();
    const int64_t hi = rank - (std::find(reduced.rbegin(), reduced.rend(), true) - reduced.rbegin());
    if (std::find(reduced.begin() + lo, reduced.begin() + hi, false) != reduced.begin() + hi) return referenceFallback(ctx);
    int64_t outer = 1, len = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d) (d < lo ? outer : d < hi ? len : inner) *= x.dims()[d];
    const bool keepdims = ctx.attrs().getInt("keepdims", 1) != 0;
    Dims out_dims;
    for (int64_t d = 0; d < rank; ++d)
        if (!reduced[d]) out_dims.push_back(x.dims()[d]);
        else if (keepdims) out_dims.push_back(1);
    const Fold f = foldOf(ctx.node.op_type);
    const double scale = f == Fold::Mean ? 1.0 / static_cast<double>(len) : 1.0;
    Tensor y = ctx.output(0, DType::F32, out_dims);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    const bool share = x.numel() > 32768;
    if (inner == 1) {
        parallelFor(outer, share, [&](int64_t o) { py[o] = static_cast<float>(foldRow(px + o * len, len, f) * scale); });
        return {y};
    }
    // [outer, len, inner]: each outer slab folds its len rows into `inner` accumulators,
    // split into column blocks so that small `outer` still fills the team.
    constexpr int64_t kCols = 1024;
    const int64_t col_blocks = (inner + kCols - 1) / kCols;
    parallelFor(outer * col_blocks, share, [&](int64_t item) {
        const int64_t o = item / col_blocks, c0 = (item % col_blocks) * kCols, cols = std::min(kCols, inner - c0);
        const float* base = px + o * len * inner + c0;
        float* out = py + o * inner + c0;
        if (f == Fold::Max || f == Fold::Min) {
            std::copy(base, base + cols, out);
            for (int64_t r = 1; r < len; ++r) foldInto(nullptr, out, base + r * inner, cols, f);
            return;
        }
        double acc[kCols] = {};
        for (int64_t r = 0; r < len; ++r) foldInto(acc, nullptr, base + r * inner, cols, f);
        for (int64_t i = 0; i < cols; ++i) out[i] = static_cast<float>(acc[i] * scale);
    });
    return {y};
}

}  // namespace

void addReduceTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "reduce", {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceMax", "ReduceMin"}, supportsAnyNode, fastReduce});
}

}  // namespace kiln
