// Route parameters of the CUDA target. Declared in every build (with or without CUDA) so
// that route texts and tuning caches mean the same everywhere.
#pragma once
#include <vector>

#include "ir/parameter.h"

namespace kiln::cuda {

std::vector<ParameterSpec> cudaParameters();

}  // namespace kiln::cuda
