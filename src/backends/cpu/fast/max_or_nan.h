// The reference kernels' MaxPool rule for the fast pooling kernels: the larger of a and b,
// or NaN when either is NaN. A compare and a select: std::fmax is a libm call per element
// and drops NaN.
#pragma once
#include <immintrin.h>

namespace kiln {

inline float maxOrNan(float a, float b) { return (b > a || b != b) ? b : a; }

// maxOrNan over 8 lanes.
__attribute__((target("avx2"))) inline __m256 maxOrNan8(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

// maxOrNan over 16 lanes.
__attribute__((target("avx512f"))) inline __m512 maxOrNan16(__m512 a, __m512 b) {
    return _mm512_mask_add_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q), a, b);
}

}  // namespace kiln
