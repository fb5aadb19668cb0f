// Checks on CUDA, cuBLAS and cuDNN return codes: a failure becomes kiln::Error naming
// the call, so it reaches the CLI as one line instead of a crash.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "ir/error.h"

#define KILN_CUDA_CHECK(call)                                                                                          \
    do {                                                                                                               \
        const cudaError_t kiln_status_ = (call);                                                                       \
        if (kiln_status_ != cudaSuccess)                                                                               \
            throw ::kiln::Error(std::string("CUDA error in ") + #call + ": " + cudaGetErrorString(kiln_status_));       \
    } while (0)
