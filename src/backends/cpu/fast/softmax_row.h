// Softmax of rows of floats, vectorized with AVX2 where the CPU has it (a polynomial exp
// instead of a libm call per element: the attention kernels spend much of their time here).
#pragma once
#include <cstdint>

namespace kiln {

// In place over `len` floats; -inf scores give 0, a row without a finite maximum (all -inf,
// +inf) follows the scalar rule (NaN), NaN scores make the row NaN.
void softmaxRow(float* x, int64_t len);
// Log-softmax in place: x - max - log(sum(exp(x - max))).
void logSoftmaxRow(float* x, int64_t len);

}  // namespace kiln
