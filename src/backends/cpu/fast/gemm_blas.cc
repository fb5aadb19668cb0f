// MatMul, Gemm and FusedMatMul on an sgemm (f32), with the bias/activation/residual epilogue
// fused into one pass. Batched MatMul with a shared 2-D B folds the batch into M. Two
// tactics: "blas" (OpenBLAS) and, when Kiln is built with oneDNN, "dnnl" (its sgemm, faster
// on some of the small shapes transformers have); single rows use Kiln's own GEMV in both (gemv.cc).
#include <cblas.h>
#ifdef KILN_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#include <algorithm>

#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

// Threads for a GEMM: each at least kMacsPerThread multiply-adds. Entering a parallel
// region and its barrier cost microseconds, more than a small GEMM takes alone (Silero's
// LSTM input projections ran 1.7x slower on two threads than on one).
int gemmThreads(int64_t M, int64_t N, int64_t K) {
    constexpr double kMacsPerThread = 262144;
    const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    return static_cast<int>(std::clamp(macs / kMacsPerThread, 1.0, static_cast<double>(std::max(1, cpuThreads()))));
}

void blasSgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
    const ScopedOmpThreads threads(gemmThreads(M, N, K));
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

#ifdef KILN_WITH_DNNL
void dnnlSgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
    const ScopedOmpThreads threads(gemmThreads(M, N, K));
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) != dnnl_success)
        blasSgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // shapes oneDNN refuses
}
#endif

namespace {

bool matmulLike(const Node& n, const Graph&) {
    if (n.op_type == "Gemm") return true;
    return n.op_type == "MatMul" || n.op_type == "FusedMatMul";
}

std::vector<Tensor> matmulWith(const KernelContext& ctx, SgemmFn sgemm) {
    const Node& n = ctx.node;
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    if (a.dtype() != DType::F32 || b.dtype() != DType::F32 || a.rank() < 2 || b.rank() < 2) return referenceFallback(ctx);
    const bool gemm = n.op_type == "Gemm";
    const bool trans_a = gemm && n.attrs.getInt("transA", 0) != 0;
    const bool trans_b = gemm ? n.attrs.getInt("transB", 0) != 0 : n.attrs.getInt("trans_b", 0) != 0;
    if (gemm && (a.rank() != 2 || b.rank() != 2)) return referenceFallback(ctx);
    if (trans_b && b.rank() != 2) return referenceFallback(ctx);
    const int64_t M = trans_a ? a.dims()[a.rank() - 1] : a.dims()[a.rank() - 2];
    const int64_t K = trans_a ? a.dims()[a.rank() - 2] : a.dims()[a.rank() - 1];
    const int64_t Kb = trans_b ? b.dims()[1] : b.dims()[b.rank() - 2];
    const int64_t N = trans_b ? b.dims()[0] : b.dims()[b.rank() - 1];
    ctx.require(K == Kb, [&] { return "inner dimensions differ: " + a.summary() + " x " + b.summary(); });
    const Dims a_batch(a.dims().begin(), a.dims().end() - 2), b_batch(b.dims().begin(), b.dims().end() - 2);
    const Dims batch = broadcastDims(a_batch, b_batch, [&] { return n.describe(); });
    Dims out_dims = batch;
    out_dims.insert(out_dims.end(), {M, N});
    // FusedMatMul's epilogue operands, checked before the GEMM runs: other shapes (a broadcast
    // residual) take the reference path.
    const Tensor* bias = n.op_type == "FusedMatMul" ? ctx.optionalInput(2) : nullptr;
    const Tensor* residual = n.op_type == "FusedMatMul" ? ctx.optionalInput(3) : nullptr;
    if (bias && (bias->dtype() != DType::F32 || bias->numel() != N)) return referenceFallback(ctx);
    if (residual && (residual->dtype() != DType::F32 || residual->dims() != out_dims)) return referenceFallback(ctx);
    Tensor out = ctx.output(0, DType::F32, out_dims);
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* po = out.data<float>();
    const int64_t nb = numElements(batch);
    float alpha = gemm ? n.attrs.getFloat("alpha", 1.0f) : 1.0f;
    if (b_batch.empty() && !trans_a && a_batch == batch && nb * M == 1) {
        // A single row: a matrix-vector product (sgemm is slow for M = 1).
        rowTimesMatrix(trans_b, K, N, alpha, pa, pb, po);
    } else if (b_batch.empty() && !trans_a && a_batch == batch) {
        // Shared B: one GEMM over all batch rows.
        sgemm(false, trans_b, nb * M, N, K, alpha, pa, K, pb, trans_b ? K : N, 0.0f, po, N);
    } else {
        auto a_off = broadcastOffsets(batch, a_batch), b_off = broadcastOffsets(batch, b_batch);
        for (int64_t i = 0; i < nb; ++i)
            sgemm(trans_a, trans_b, M, N, K, alpha, pa + a_off[i] * M * K, trans_a ? M : K, pb + b_off[i] * K * N, trans_b ? K : N, 0.0f, po + i * M * N, N);
    }
    const int64_t rows = nb * M;
    if (n.op_type == "FusedMatMul") {
        applyEpilogue(po, rows, N, bias ? bias->data<float>() : nullptr, false, residual ? residual->data<float>() : nullptr, Activation::fromNode(n));
    } else if (gemm && ctx.hasInput(2)) {
        const Tensor& c = ctx.input(2);
        const float beta = n.attrs.getFloat("beta", 1.0f);
        if (c.dtype() != DType::F32) return referenceFallback(ctx);
        if (c.numel() == N && beta == 1.0f && (c.rank() == 1 || c.dims()[0] == 1)) {
            applyEpilogue(po, rows, N, c.data<float>(), false, nullptr, Activation{});
        } else {
            broadcastDims({M, N}, c.dims(), [&] { return n.describe(); });  // C must broadcast to [M, N]
            auto off = broadcastOffsets({M, N}, c.dims());
            const float* pc = c.data<float>();
            for (int64_t i = 0; i < M * N; ++i) po[i] += beta * pc[off[i]];
        }
    }
    return {out};
}

std::vector<Tensor> blasMatMul(const KernelContext& ctx) { return matmulWith(ctx, blasSgemm); }
#ifdef KILN_WITH_DNNL
std::vector<Tensor> dnnlMatMul(const KernelContext& ctx) { return matmulWith(ctx, dnnlSgemm); }
#endif

}  // namespace

void addGemmTactics(std::vector<Tactic>& t) {
    t.push_back({"blas", "gemm", {"MatMul", "FusedMatMul", "Gemm"}, matmulLike, blasMatMul});
#ifdef KILN_WITH_DNNL
    t.push_back({"dnnl", "gemm", {"MatMul", "FusedMatMul", "Gemm"}, matmulLike, dnnlMatMul});
#endif
}

}  // namespace kiln
