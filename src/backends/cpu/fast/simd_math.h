// Vector math for the AVX2 kernels (callers check cpuHasAvx2Fma first): polynomial exp,
// and the sigmoid and tanh built on it, instead of a libm call per element.
#pragma once
#include <immintrin.h>

namespace kiln {

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

// sigmoid(x) from e = exp(-|x|): 1 / (1 + e) for x >= 0, e / (1 + e) below; no overflow.
__attribute__((target("avx2,fma"))) inline __m256 sigmoidAvx2(__m256 x) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 e = expNonPositive(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_and_ps(x, abs_mask)));
    const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// tanh(x) = sign(x) (1 - e) / (1 + e) with e = exp(-2|x|); below |x| = 1/16, where that
// difference cancels, its odd Taylor series to x^7 (error under 1e-10).
__attribute__((target("avx2,fma"))) inline __m256 tanhAvx2(__m256 x) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const __m256 ax = _mm256_andnot_ps(sign_mask, x);
    const __m256 e = expNonPositive(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(-17.0f / 315.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    p = _mm256_fmadd_ps(p, x2, one);
    const __m256 small = _mm256_mul_ps(p, ax);
    const __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.0625f), _CMP_LT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(x, sign_mask));
}

}  // namespace kiln
