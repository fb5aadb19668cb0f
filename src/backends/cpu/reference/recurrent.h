// LSTM, GRU and RNN (ONNX semantics: directions, layouts, sequence_lens, peepholes, clip,
// linear_before_reset, any activations). One implementation of the recurrence, with the
// matrix products handed in: the reference kernels pass a plain triple loop, the fast
// CPU tactic BLAS.
#pragma once
#include <cstdint>

#include "backends/cpu/reference/kernel.h"

namespace kiln {

// C[M,N] += A[M,K] · B[N,K]^T, row-major with leading dimensions lda, ldb, ldc (the ONNX
// weight layout: each gate's rows of W and R are rows of B).
using RecurrentGemm = void (*)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc);

// The node's outputs (Y, Y_h and, for LSTM, Y_c) for op_type LSTM, GRU or RNN.
std::vector<Tensor> recurrentKernel(const KernelContext& ctx, RecurrentGemm gemm);

}  // namespace kiln
