// What the oneDNN-backed CPU tactics share: one CPU engine (and, from parallel_for.h, the
// scoped OpenMP thread count). Only included where KILN_WITH_DNNL is defined.
#pragma once
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "backends/cpu/fast/parallel_for.h"

namespace kiln {

inline const dnnl::engine& dnnlCpuEngine() {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}


}  // namespace kiln
