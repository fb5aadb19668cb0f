// The CPU target: reference kernels and the fast tactics (backends/cpu/fast), each node's
// tactic timed at build time, and an executor that plans one activation arena per input shape.
#pragma once
#include "backends/backend.h"

namespace kiln {

const Backend& cpuBackend();

// The route with each CPU precision parameter (those of the precision_assignment pass:
// precision.matmul, .conv, ...) that asks for f16 or bf16 without native support set back to
// f32, and a warning for each: a precision never makes an engine slower without saying so.
BuildRoute keepNativeCpuPrecisions(const BuildRoute& route, bool native_f16, bool native_bf16, std::vector<std::string>* warnings);

}  // namespace kiln
