// Gemm and MatMul (numpy semantics: 1-D promotion and batch broadcasting).
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

std::vector<Tensor> gemm(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor* c = ctx.optionalInput(2);
    ctx.require(a.rank() == 2 && b.rank() == 2, [&] { return "A and B must be 2-D, got " + a.summary() + " and " + b.summary(); });
    const bool ta = ctx.attrs().getInt("transA", 0) != 0;
    const bool tb = ctx.attrs().getInt("transB", 0) != 0;
    const double alpha = ctx.attrs().getFloat("alpha", 1.0f);
    const double beta = ctx.attrs().getFloat("beta", 1.0f);
    const int64_t M = ta ? a.dims()[1] : a.dims()[0];
    const int64_t K = ta ? a.dims()[0] : a.dims()[1];
    const int64_t Kb = tb ? b.dims()[1] : b.dims()[0];
    const int64_t N = tb ? b.dims()[0] : b.dims()[1];
    ctx.require(K == Kb, [&] { return "inner dimensions differ: " + a.summary() + (ta ? "^T" : "") + " x " + b.summary() + (tb ? "^T" : ""); });
    std::vector<int64_t> c_off;
    if (c) c_off = broadcastOffsets({M, N}, c->dims());
    if (c) broadcastDims({M, N}, c->dims(), [&] { return ctx.node.describe(); });
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(a.dtype(), {M, N});
        const T* pa = a.data<T>();
        const T* pb = b.data<T>();
        T* po = out.data<T>();
        for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
                double acc = 0;
                for (int64_t k = 0; k < K; ++k) {
                    double av = static_cast<double>(ta ? pa[k * M + i] : pa[i * K + k]);
                    double bv = static_cast<double>(tb ? pb[j * K + k] : pb[k * N + j]);
                    acc += av * bv;
                }
                acc *= alpha;
                if (c) acc += beta * c->scalarAt(c_off[i * N + j]);
                po[i * N + j] = static_cast<T>(acc);
            }
        return out;
    })};
}

}  // namespace

std::vector<Tensor> matmulKernel(const KernelContext& ctx) {
    Tensor a = ctx.input(0);
    Tensor b = ctx.input(1);
    ctx.require(a.rank() >= 1 && b.rank() >= 1, "inputs must have rank >= 1");
    ctx.require(a.dtype() == b.dtype(), [&] { return "inputs have different element types " + a.summary() + " and " + b.summary(); });
    const bool a_vec = a.rank() == 1, b_vec = b.rank() == 1;
    if (a_vec) a = a.reshaped({1, a.dims()[0]});
    if (b_vec) b = b.reshaped({b.dims()[0], 1});
    const int64_t M = a.dims()[a.rank() - 2], K = a.dims()[a.rank() - 1];
    const int64_t Kb = b.dims()[b.rank() - 2], N = b.dims()[b.rank() - 1];
    ctx.require(K == Kb, [&] { return "inner dimensions differ: " + ctx.input(0).summary() + " x " + ctx.input(1).summary(); });
    Dims a_batch(a.dims().begin(), a.dims().end() - 2), b_batch(b.dims().begin(), b.dims().end() - 2);
    Dims batch = broadcastDims(a_batch, b_batch, [&] { return ctx.node.describe(); });
    auto a_off = broadcastOffsets(batch, a_batch);
    auto b_off = broadcastOffsets(batch, b_batch);
    Dims out_dims = batch;
    if (!a_vec) out_dims.push_back(M);
    if (!b_vec) out_dims.push_back(N);
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(a.dtype(), out_dims);
        const T* pa = a.data<T>();
        const T* pb = b.data<T>();
        T* po = out.data<T>();
        const int64_t nb = numElements(batch);
        std::vector<double> row(static_cast<size_t>(N));
        for (int64_t bi = 0; bi < nb; ++bi) {
            const T* ab = pa + a_off[bi] * M * K;
            const T* bb = pb + b_off[bi] * K * N;
            T* ob = po + bi * M * N;
            for (int64_t i = 0; i < M; ++i) {
                std::fill(row.begin(), row.end(), 0.0);
                for (int64_t k = 0; k < K; ++k) {
                    const double av = static_cast<double>(ab[i * K + k]);
                    for (int64_t j = 0; j < N; ++j) row[j] += av * static_cast<double>(bb[k * N + j]);
                }
                for (int64_t j = 0; j < N; ++j) ob[i * N + j] = static_cast<T>(row[j]);
            }
        }
        return out;
    })};
}

void registerGemmKernels(KernelRegistry& r) {
    r.add("Gemm", gemm);
    r.add("MatMul", matmulKernel);
}

}  // namespace kiln
