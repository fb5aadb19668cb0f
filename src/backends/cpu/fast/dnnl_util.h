// What the oneDNN-backed CPU tactics share: one CPU engine (and, from parallel_for.h, the
// scoped OpenMP thread count). Only included where KILN_WITH_DNNL is defined.
#pragma once
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "backends/cpu/fast/parallel_for.h"

namespace kiln {

inline const dnnl::engine& dnnlCpuEngine() {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

// This thread's stream on that engine (a stream is not to be shared between threads).
inline dnnl::stream& dnnlCpuStream() {
    thread_local dnnl::stream stream(dnnlCpuEngine());
    return stream;
}

// Whether oneDNN picked its reference implementation (slow: the callers look for another way).
inline bool dnnlReferenceImplementation(const char* impl_info) { return std::string(impl_info).rfind("ref", 0) == 0; }

}  // namespace kiln
