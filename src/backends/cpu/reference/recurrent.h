// LSTM, GRU and RNN (ONNX semantics: directions, layouts, sequence_lens, peepholes, clip,
// linear_before_reset, any activations). One implementation of the recurrence, with the
// matrix products handed in: the reference kernels pass a plain triple loop, the fast
// CPU tactic BLAS.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

// C[M,N] += A[M,K] · B[N,K]^T, row-major with leading dimensions lda, ldb, ldc (the ONNX
// weight layout: each gate's rows of W and R are rows of B).
using RecurrentGemm = void (*)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc);

// A node's sizes and starting values as the recurrence reads them, checked against each other.
struct RecurrentProblem {
    bool lstm = false, gru = false;
    int64_t G = 1, S = 0, B = 0, I = 0, D = 1, H = 0;  // gates, steps, batch, input, directions, hidden
    bool batch_major = false;                          // layout=1
    std::string direction;
    std::vector<int64_t> lens;  // steps per batch row (sequence_lens)
    std::vector<float> xs;      // X, time-major [S, B, I]
    std::vector<float> h, c;    // the states, time-major [D, B, H] (c: LSTM only); final after the run
};
RecurrentProblem recurrentProblem(const KernelContext& ctx);
// The node's outputs from Y (time-major [S, D, B, H]) and the final states, in its layout.
std::vector<Tensor> recurrentOutputs(const RecurrentProblem& p, const std::vector<float>& y);

// The node's outputs (Y, Y_h and, for LSTM, Y_c) for op_type LSTM, GRU or RNN.
std::vector<Tensor> recurrentKernel(const KernelContext& ctx, RecurrentGemm gemm);

}  // namespace kiln
