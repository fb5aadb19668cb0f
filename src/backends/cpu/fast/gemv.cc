// A row times a matrix (M = 1 GEMMs: batch-1 MLPs, DLRM's towers). Its cost is reading the
// weights once, so threads help only when each gets enough of them: OpenBLAS's sgemv used
// every thread on 64 KB of weights, and DLRM's batch-1 run got slower with more cores (a
// 256 x 64 layer took 2 us on one thread, 6 on two). Threads here each take at least
// kBytesPerThread of weights, and a contiguous slice of the outputs.
#include <omp.h>

#include <algorithm>

#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/tactics.h"

namespace kiln {

namespace {

constexpr int64_t kBytesPerThread = 256 * 1024;
constexpr int64_t kColumnChunk = 512;  // outputs kept in L1 while the rows stream by

// y[n0, n1) = alpha * x · B[:, n0:n1) for row-major B [K, N]: four rows of B per pass over
// the outputs.
__attribute__((target_clones("avx512f", "avx2", "default"))) void columnsTimes(const float* x, const float* B, int64_t K, int64_t N, int64_t n0,
                                                                               int64_t n1, float alpha, float* y) {
    for (int64_t c0 = n0; c0 < n1; c0 += kColumnChunk) {
        const int64_t c1 = std::min(n1, c0 + kColumnChunk);
        float* yc = y + c0;
        const int64_t w = c1 - c0;
        for (int64_t j = 0; j < w; ++j) yc[j] = 0.f;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4) {
            const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
            const float *r0 = B + k * N + c0, *r1 = r0 + N, *r2 = r1 + N, *r3 = r2 + N;
#pragma omp simd
            for (int64_t j = 0; j < w; ++j) yc[j] += x0 * r0[j] + x1 * r1[j] + x2 * r2[j] + x3 * r3[j];
        }
        for (; k < K; ++k) {
            const float xk = x[k];
            const float* r = B + k * N + c0;
#pragma omp simd
            for (int64_t j = 0; j < w; ++j) yc[j] += xk * r[j];
        }
        if (alpha != 1.f)
            for (int64_t j = 0; j < w; ++j) yc[j] *= alpha;
    }
}

// y[n0, n1) = alpha * B[n, :] · x for row-major B [N, K] (a transposed weight).
__attribute__((target_clones("avx512f", "avx2", "default"))) void rowsDot(const float* x, const float* B, int64_t K, int64_t n0, int64_t n1, float alpha,
                                                                          float* y) {
    for (int64_t n = n0; n < n1; ++n) {
        const float* r = B + n * K;
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += x[k] * r[k];
        y[n] = alpha * s;
    }
}

}  // namespace

void rowTimesMatrix(bool trans_b, int64_t K, int64_t N, float alpha, const float* x, const float* B, float* y) {
    const int64_t bytes = K * N * static_cast<int64_t>(sizeof(float));
    const int threads = static_cast<int>(std::clamp<int64_t>(bytes / kBytesPerThread, 1, std::max(1, cpuThreads())));
    auto slice = [&](int64_t n0, int64_t n1) {
        if (trans_b) rowsDot(x, B, K, n0, n1, alpha, y);
        else columnsTimes(x, B, K, N, n0, n1, alpha, y);
    };
    if (threads == 1) return slice(0, N);
    // Slices of whole 16-float lines, so that no two threads write one cache line.
    const int64_t per = ((N + threads - 1) / threads + 15) & ~int64_t{15};
#pragma omp parallel num_threads(threads)
    {
        const int64_t n0 = std::min(N, omp_get_thread_num() * per), n1 = std::min(N, n0 + per);
        if (n0 < n1) slice(n0, n1);
    }
}

}  // namespace kiln
