// LSTM, GRU and RNN with their matrix products on the preferred sgemm: the input projection
// of all steps in one product, then one product per step for the recurrence.
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/recurrent.h"

namespace kiln {

namespace {

void sgemmAccumulate(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
    if (M == 0 || N == 0 || K == 0) return;
    kPreferredSgemm(false, true, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}

std::vector<Tensor> blasRecurrent(const KernelContext& ctx) { return recurrentKernel(ctx, sgemmAccumulate); }

}  // namespace

void addRecurrentTactics(std::vector<Tactic>& t) { t.push_back({"blas", "rnn", {"LSTM", "GRU", "RNN"}, supportsAnyNode, blasRecurrent}); }

}  // namespace kiln
