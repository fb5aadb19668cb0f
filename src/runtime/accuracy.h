// Error metrics between a computed output and a trusted one (golden data).
#pragma once
#include "ir/tensor.h"

namespace kiln {

struct ErrorStats {
    double max_abs = 0;  // max |got - want|
    double rel_l2 = 0;   // ||got - want|| / ||want|| (absolute L2 when ||want|| is 0)
    double cosine = 1;   // cosine similarity of got and want (1 when both are zero)
    bool nan_mismatch = false;  // NaN in one where the other has none
};

// Compares element by element in double. Throws Error if dtypes or shapes differ.
ErrorStats compareOutputs(const Tensor& got, const Tensor& want, const std::string& name);

// Fraction of rows (along the last axis) whose top-1 index in `got` is among the top-k
// indices of `want`.
double topKAgreement(const Tensor& got, const Tensor& want, int64_t k, const std::string& name);

}  // namespace kiln
