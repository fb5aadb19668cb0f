// The row-major sgemm behind the fast GEMM and convolution tactics: OpenBLAS always, and
// oneDNN's when Kiln is built with it (KILN_WITH_DNNL).
#pragma once
#include <cstdint>

namespace kiln {

// C = alpha op(A) op(B) + beta C, row-major.
using SgemmFn = void (*)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb,
                         float beta, float* C, int64_t ldc);

void blasSgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
#ifdef KILN_WITH_DNNL
void dnnlSgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
#endif
// y = alpha x · op(B) for one row x [K]: B is [K, N], or [N, K] with trans_b. Threads only
// where the weights are large enough to pay for them.
void rowTimesMatrix(bool trans_b, int64_t K, int64_t N, float alpha, const float* x, const float* B, float* y);

// The faster of the two where one is wanted without timing: oneDNN's when built with it.
#ifdef KILN_WITH_DNNL
constexpr SgemmFn kPreferredSgemm = dnnlSgemm;
#else
constexpr SgemmFn kPreferredSgemm = blasSgemm;
#endif

}  // namespace kiln
