#include "backends/cpu/fast/softmax_row.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/fast/simd_math.h"
#include "backends/cpu/fast/tactics.h"

namespace kiln {

namespace {

void softmaxRowScalar(float* x, int64_t len) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) mx = std::max(mx, x[j]);  // not std::fmax: a libm call per element
    float sum = 0;
    for (int64_t j = 0; j < len; ++j) sum += (x[j] = std::exp(x[j] - mx));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < len; ++j) x[j] *= inv;
}

__attribute__((target("avx2,fma"))) void softmaxRowAvx2(float* x, int64_t len) {
    const int64_t whole = len / 8 * 8;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < whole; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = -INFINITY;
    for (float v : lanes) mx = std::max(mx, v);
    for (int64_t j = whole; j < len; ++j) mx = std::max(mx, x[j]);
    if (!std::isfinite(mx)) return softmaxRowScalar(x, len);
    const __m256 m = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < whole; j += 8) {
        const __m256 e = expNonPositive(_mm256_sub_ps(_mm256_loadu_ps(x + j), m));
        _mm256_storeu_ps(x + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    _mm256_store_ps(lanes, vsum);
    float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (int64_t j = whole; j < len; ++j) sum += (x[j] = std::exp(x[j] - mx));
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (int64_t j = 0; j < whole; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
    for (int64_t j = whole; j < len; ++j) x[j] *= 1.0f / sum;
}

}  // namespace

void softmaxRow(float* x, int64_t len) {
    if (cpuHasAvx2Fma()) softmaxRowAvx2(x, len);
    else softmaxRowScalar(x, len);
}

// Sums in double: log-probabilities of wide rows are compared at 1e-6 absolute.
void logSoftmaxRow(float* x, int64_t len) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) mx = std::max(mx, x[j]);
    if (!std::isfinite(mx)) {
        for (int64_t j = 0; j < len; ++j) x[j] = NAN;  // as the reference: exp(inf - inf) poisons the sum
        return;
    }
    double sum = 0;
    for (int64_t j = 0; j < len; ++j) sum += std::exp(static_cast<double>(x[j] - mx));
    const float log_sum = static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < len; ++j) x[j] = (x[j] - mx) - log_sum;
}

}  // namespace kiln
