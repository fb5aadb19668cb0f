#include "backends/cpu/fast/softmax_row.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

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

// exp(x) for x <= 0 (scores minus their maximum), Cephes' expf: x = n ln2 + r, a degree-5
// polynomial in r, 2^n through the exponent bits; about 1 ulp. Inputs below -87.3 give 0
// (as expf underflows); NaN stays NaN (min/max return their second operand on NaN).
__attribute__((target("avx2,fma"))) inline __m256 expNonPositive(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_setzero_ps(), x));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
    return _mm256_andnot_ps(under, y);  // NaN compares false: it stays
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
