// QuantizeLinear and DequantizeLinear per tensor between f32 and 8-bit integers: what stays of
// a QDQ model's Q/DQ nodes once qdq_fusion has folded those around its convs and matmuls
// (around its adds, pools and concats). One vectorizable loop each, with the reference
// kernel's arithmetic (one f32 division, round half to even, saturate), so the results are
// the same to the bit; quantizing in AVX-512 or AVX2 registers (GCC leaves nearbyint in a
// loop scalar: 2 ms a run of PP-OCRv4's recognizer, a fifth of it). Other forms (per axis, blocked, 16-bit) take the reference kernel.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"

namespace kiln {

namespace {

// Scalar f32 scale and an 8-bit zero point: the per-tensor form the loops below take.
bool perTensor8Bit(const KernelContext& ctx, DType quantized) {
    const Tensor* zp = ctx.optionalInput(2);
    return ctx.input(1).numel() == 1 && ctx.input(1).dtype() == DType::F32 && zp && zp->numel() == 1 && zp->dtype() == quantized && isEightBitInteger(quantized) &&
           ctx.attrs().getInt("block_size", 0) == 0;
}

constexpr int64_t kChunk = 1 << 16;  // elements per shared item: big enough to pay for a thread

// y = saturate(round_half_even(x / scale) + zp), 16 (AVX-512) or 8 (AVX2) at a time: the
// division, not a multiplication by 1 / scale, so that every element is the reference's.
// GCC 12 warns about the intrinsics' own undefined-vector helpers under -O3; nothing here is uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <typename T>
__attribute__((target("avx512f"))) int64_t quantize16(const float* x, T* y, int64_t n, float scale, float zp, float lo, float hi) {
    const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zp), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(v, z), vlo), vhi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
    return i;
}

template <typename T>
__attribute__((target("avx2"))) int64_t quantize8(const float* x, T* y, int64_t n, float scale, float zp, float lo, float hi) {
    const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zp), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(v, z), vlo), vhi);
        const __m256i w = _mm256_packs_epi32(_mm256_cvtps_epi32(v), _mm256_setzero_si256());  // in range: no saturation here
        const __m256i b = std::is_signed_v<T> ? _mm256_packs_epi16(w, w) : _mm256_packus_epi16(w, w);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
    }
    return i;
}

#pragma GCC diagnostic pop

template <typename T>
void quantizeRun(const float* x, T* y, int64_t n, float scale, float zp) {
    const float lo = static_cast<float>(std::numeric_limits<T>::lowest()), hi = static_cast<float>(std::numeric_limits<T>::max());
    int64_t i = cpuHasAvx512() ? quantize16(x, y, n, scale, zp, lo, hi) : cpuHasAvx2Fma() ? quantize8(x, y, n, scale, zp, lo, hi) : 0;
    for (; i < n; ++i) y[i] = static_cast<T>(std::min(std::max(std::nearbyint(x[i] / scale) + zp, lo), hi));
}

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default"))) void dequantizeRun(const T* x, float* y, int64_t n, float scale, int32_t zp) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zp) * scale;
}

template <typename F>
void inChunks(int64_t n, F run) {
    parallelFor((n + kChunk - 1) / kChunk, n >= 2 * kChunk, [&](int64_t c) { run(c * kChunk, std::min(n, (c + 1) * kChunk) - c * kChunk); });
}

std::vector<Tensor> fastQuantize(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor* zp = ctx.optionalInput(2);
    if (x.dtype() != DType::F32 || !zp || !perTensor8Bit(ctx, zp->dtype())) return referenceFallback(ctx);
    const float scale = static_cast<float>(ctx.input(1).scalarAt(0)), z = static_cast<float>(zp->scalarAt(0));
    Tensor y = ctx.output(0, zp->dtype(), x.dims());
    const float* px = x.data<float>();
    if (zp->dtype() == DType::U8) inChunks(x.numel(), [&](int64_t at, int64_t n) { quantizeRun(px + at, y.data<uint8_t>() + at, n, scale, z); });
    else inChunks(x.numel(), [&](int64_t at, int64_t n) { quantizeRun(px + at, y.data<int8_t>() + at, n, scale, z); });
    return {y};
}

std::vector<Tensor> fastDequantize(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (!perTensor8Bit(ctx, x.dtype())) return referenceFallback(ctx);
    const float scale = static_cast<float>(ctx.input(1).scalarAt(0));
    const auto z = static_cast<int32_t>(ctx.input(2).scalarAt(0));
    Tensor y = ctx.output(0, DType::F32, x.dims());
    float* py = y.data<float>();
    if (x.dtype() == DType::U8) inChunks(x.numel(), [&](int64_t at, int64_t n) { dequantizeRun(x.data<uint8_t>() + at, py + at, n, scale, z); });
    else inChunks(x.numel(), [&](int64_t at, int64_t n) { dequantizeRun(x.data<int8_t>() + at, py + at, n, scale, z); });
    return {y};
}

// 64 lookups at a time in AVX-512 VBMI registers: the 256-entry table as four 64-byte
// quarters, two two-source byte permutes by the low 7 bits and a blend on the high one.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) int64_t lookup64(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table, uint8_t offset) {
    const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64), t2 = _mm512_loadu_si512(table + 128),
                  t3 = _mm512_loadu_si512(table + 192), off = _mm512_set1_epi8(static_cast<char>(offset));
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i c = _mm512_add_epi8(_mm512_loadu_si512(x + i), off);
        const __m512i lo = _mm512_permutex2var_epi8(t0, c, t1), hi = _mm512_permutex2var_epi8(t2, c, t3);
        _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(c), lo, hi));
    }
    return i;
}

// The table lookup (cf. the reference kernel), shared between threads on large tensors.
std::vector<Tensor> fastLookup(const KernelContext& ctx) {
    const Tensor &x = ctx.input(0), &table = ctx.input(1);
    if (!isEightBitInteger(x.dtype()) || table.numel() != 256 || dtypeSize(table.dtype()) != 1) return referenceFallback(ctx);
    Tensor y = ctx.output(0, table.dtype(), x.dims());
    const auto* __restrict t = reinterpret_cast<const uint8_t*>(table.raw());
    const auto* __restrict px = reinterpret_cast<const uint8_t*>(x.raw());
    auto* __restrict py = reinterpret_cast<uint8_t*>(y.raw());
    const uint8_t offset = x.dtype() == DType::I8 ? 128 : 0;
    static const bool vbmi = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw");
    inChunks(x.numel(), [&](int64_t at, int64_t n) {
        int64_t i = vbmi ? lookup64(px + at, py + at, n, t, offset) : 0;
        for (; i < n; ++i) py[at + i] = t[static_cast<uint8_t>(px[at + i] + offset)];
    });
    return {y};
}

// Whether a node is of the per-tensor 8-bit form where its parameters' types are known at
// build time (constants or typed values); nodes it turns out not to be at run time take the
// reference kernel there.
bool supportsPerTensor(const Node& n, const Graph& g) {
    if (n.inputs.size() < 3 || n.inputs[2].empty() || n.attrs.getInt("block_size", 0) != 0) return false;
    auto scalarOf = [&](const std::string& v, DType* type) {
        if (auto c = g.initializers.find(v); c != g.initializers.end()) {
            *type = c->second.dtype();
            return c->second.numel() == 1;
        }
        const ValueInfo* info = g.findValueInfo(v);
        if (!info || !info->shape.fullyKnown() || numElements(info->shape.concrete()) != 1) return false;
        *type = info->dtype;
        return true;
    };
    DType scale = DType::Undefined, zp = DType::Undefined;
    return scalarOf(n.inputs[1], &scale) && scalarOf(n.inputs[2], &zp) && scale == DType::F32 && isEightBitInteger(zp);
}

}  // namespace

void addQuantizeTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "elementwise", {"QuantizeLinear"}, supportsPerTensor, fastQuantize});
    t.push_back({"fast", "elementwise", {"DequantizeLinear"}, supportsPerTensor, fastDequantize});
    t.push_back({"fast", "elementwise", {"QuantizedLookup"}, supportsAnyNode, fastLookup});
}

}  // namespace kiln
