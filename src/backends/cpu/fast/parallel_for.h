// Loops of the fast kernels over independent items, shared by the OpenMP team only where
// the work pays for it.
#pragma once
#include <omp.h>

#include <cstdint>

#include "backends/cpu/fast/tactics.h"

namespace kiln {

// Runs body(i) for i in [0, n): on the OpenMP team when `share` (and there are threads and
// items to share), else on the calling thread without entering libgomp. A region costs
// libgomp a futex wake-up syscall at its end even with if(false) or one thread (1.0-1.2 us
// each on the 2-core VM of 2026-12-03, a fifth of a small MaxPool), so `#pragma omp
// parallel for if(...)` is not a serial loop.
template <typename Body>
void parallelFor(int64_t n, bool share, Body&& body) {
    if (share && n > 1 && cpuThreads() > 1) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) body(i);
        return;
    }
    for (int64_t i = 0; i < n; ++i) body(i);
}

// The OpenMP thread count (which oneDNN and OpenBLAS's OpenMP build read at each call) set
// for a scope.
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
