// What the oneDNN-backed CPU tactics share: one CPU engine, and the OpenMP thread count
// (which oneDNN uses) set for a scope. Only included where KILN_WITH_DNNL is defined.
#pragma once
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

namespace kiln {

inline const dnnl::engine& dnnlCpuEngine() {
    static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

struct ScopedOmpThreads {
    int before = omp_get_max_threads();
    explicit ScopedOmpThreads(int threads) {
        if (threads != before) omp_set_num_threads(threads);
    }
    ~ScopedOmpThreads() {
        if (omp_get_max_threads() != before) omp_set_num_threads(before);
    }
    ScopedOmpThreads(const ScopedOmpThreads&) = delete;
    ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;
};

}  // namespace kiln
