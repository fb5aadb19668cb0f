// The CUDA target: our kernels, cuBLASLt and cuDNN, tactics timed on the device at build
// time, and the CUDA executor (cuda_executor.h). Without the toolkit every entry point that
// needs the device explains that it is missing.
#pragma once
#include "backends/backend.h"

namespace kiln {

const Backend& cudaBackend();

}  // namespace kiln
