// Depthwise 2-D convolutions (NCHW f32, one filter per channel) for the fast CPU backend:
// 3x3 pad-1 channels as AVX2 flat-plane stencils (in place, over a zero-bordered copy, or one
// masked vector per row, by plane width), other 3x3/5x5 ones as vector rows, the rest through
// generic loops; bias, residual and activation fused while the channel's plane is in cache.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "backends/cpu/fast/conv_geometry.h"
#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// Depthwise: one input channel per group and one filter per channel (weights [C, 1, kh, kw]).
bool supportsDepthwise(const Node& n, const Graph& g) {
    if (!conv2dNode(n) || n.inputs.size() < 2) return false;
    auto w = g.initializers.find(n.inputs[1]);
    return w != g.initializers.end() && w->second.rank() == 4 && w->second.dims()[1] == 1 && w->second.dims()[0] == n.attrs.getInt("group", 1);
}

// Output column ow of a KxK depthwise row with stride S, checking each input column against
// the row's bounds (border columns, and what a vector loop leaves over).
template <int K, int S>
inline float depthwiseColumn(const float* const* rows, const float* wc, int64_t W, int64_t pl, int64_t ow) {
    float acc = 0.0f;
    for (int kh = 0; kh < K; ++kh)
        for (int kw = 0; kw < K; ++kw) {
            const int64_t iw = ow * S - pl + kw;
            if (iw >= 0 && iw < W) acc += wc[kh * K + kw] * rows[kh][iw];
        }
    return acc;
}

// One output row of a KxK depthwise conv with stride S (no dilation). `rows` holds the K input
// rows (a zero row where they fall into the padding). Interior columns use a fixed-size tap
// loop the compiler unrolls and vectorizes across the row; border columns check bounds.
template <int K, int S>
__attribute__((always_inline)) inline void depthwiseRowBody(float* yr, const float* const* rows, const float* wc, int64_t OW, int64_t W, int64_t pl) {
    auto border = [&](int64_t ow) { yr[ow] = depthwiseColumn<K, S>(rows, wc, W, pl, ow); };
    const int64_t lo = std::min<int64_t>(OW, (pl + S - 1) / S);
    const int64_t hi = std::max<int64_t>(lo, std::min<int64_t>(OW, W - K + pl >= 0 ? (W - K + pl) / S + 1 : 0));
    for (int64_t ow = 0; ow < lo; ++ow) border(ow);
    for (int64_t ow = lo; ow < hi; ++ow) {
        float acc = 0.0f;
        const int64_t base = ow * S - pl;
#pragma GCC unroll 8
        for (int kh = 0; kh < K; ++kh)
#pragma GCC unroll 8
            for (int kw = 0; kw < K; ++kw) acc += wc[kh * K + kw] * rows[kh][base + kw];
        yr[ow] = acc;
    }
    for (int64_t ow = hi; ow < OW; ++ow) border(ow);
}

// The row kernel compiled twice: for the baseline ISA and, chosen at run time, for AVX2 + FMA
// (the library is built for generic x86-64, so the vectorized interior would be 4-wide SSE).
template <int K, int S>
void depthwiseRow(float* yr, const float* const* rows, const float* wc, int64_t OW, int64_t W, int64_t pl) {
    depthwiseRowBody<K, S>(yr, rows, wc, OW, W, pl);
}
template <int K, int S>
__attribute__((target("avx2,fma"))) void depthwiseRowAvx2(float* yr, const float* const* rows, const float* wc, int64_t OW, int64_t W, int64_t pl) {
    depthwiseRowBody<K, S>(yr, rows, wc, OW, W, pl);
}

// Stride-2 3x3 rows in explicit AVX2: 8 outputs per step with the 9 taps in registers, the
// even and odd input columns taken apart with shuffles (the compiler's version of the
// generic row was slower: 580 -> 480 us over MobileNetV2's four stride-2 layers).
__attribute__((target("avx2,fma"))) inline __m256 evenLanes(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)));
}
__attribute__((target("avx2,fma"))) inline __m256 oddLanes(__m256 a, __m256 b) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)));
}

__attribute__((target("avx2,fma"))) void depthwise3x3Stride2RowAvx2(float* yr, const float* const* rows, const float* wc, int64_t OW, int64_t W, int64_t pl) {
    constexpr int64_t S = 2;
    // Interior steps of 8 output columns from the first without left padding, while the
    // step's loads stay inside the row: columns base .. base + 17.
    const int64_t lo = std::min<int64_t>(OW, (pl + S - 1) / S);
    constexpr int64_t span = 18;
    int64_t ow = lo;
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_broadcast_ss(wc + i);
    for (; ow + 8 <= OW && ow * S - pl + span <= W; ow += 8) {
        const int64_t base = ow * S - pl;
        __m256 acc = _mm256_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
            const float* r = rows[kh] + base;
            const __m256 a = _mm256_loadu_ps(r), b = _mm256_loadu_ps(r + 8), a2 = _mm256_loadu_ps(r + 2), b2 = _mm256_loadu_ps(r + 10);
            acc = _mm256_fmadd_ps(w[kh * 3], evenLanes(a, b), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 1], oddLanes(a, b), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 2], evenLanes(a2, b2), acc);
        }
        _mm256_storeu_ps(yr + ow, acc);
    }
    // Left border columns, then the interior's remainder and the right border.
    for (int64_t o = 0; o < lo; ++o) yr[o] = depthwiseColumn<3, 2>(rows, wc, W, pl, o);
    for (int64_t o = ow; o < OW; ++o) yr[o] = depthwiseColumn<3, 2>(rows, wc, W, pl, o);
}

// A whole channel of a 3x3, stride-1, pad-1 depthwise conv in AVX2, as one stencil over the
// flattened plane: outputs whose 9 inputs all lie inside the plane come 8 at a time along
// the flat index, wrapping across rows (the row-at-a-time kernel ran scalar on MobileNet's
// 7- and 14-wide planes); the wrapped first and last columns and the top and bottom rows
// are then recomputed with bounds checks. Needs H, W >= 3.
__attribute__((target("avx2,fma"))) void depthwise3x3PlaneAvx2(float* y, const float* x, const float* wc, int64_t H, int64_t W) {
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_broadcast_ss(wc + i);
    const int64_t first = W + 1, end = (H - 1) * W - 1;  // flat outputs [first, end) read only inside the plane
    int64_t i = first;
    for (; i + 8 <= end; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int kh = 0; kh < 3; ++kh) {
            const float* r = x + i + (kh - 1) * W - 1;
            acc = _mm256_fmadd_ps(w[kh * 3], _mm256_loadu_ps(r), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 1], _mm256_loadu_ps(r + 1), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 2], _mm256_loadu_ps(r + 2), acc);
        }
        _mm256_storeu_ps(y + i, acc);
    }
    auto at = [&](int64_t oh, int64_t ow) {
        float acc = 0.0f;
        for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw) {
                const int64_t ih = oh + kh - 1, iw = ow + kw - 1;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W) acc += wc[kh * 3 + kw] * x[ih * W + iw];
            }
        y[oh * W + ow] = acc;
    };
    for (; i < end; ++i) at(i / W, i % W);
    for (int64_t ow = 0; ow < W; ++ow) at(0, ow), at(H - 1, ow);
    for (int64_t oh = 1; oh < H - 1; ++oh) at(oh, 0), at(oh, W - 1);
}

// A 3x3, pad-1 depthwise channel on a small plane (MobileNet's 14- and 7-wide ones, where
// the flat-plane stencil above leaves a third to most outputs to its scalar border code):
// the plane is copied into a zero-bordered (H + 2) x (W + 2) buffer and the stencil runs 8
// outputs at a time along the padded flat index, two wasted columns per row and no bounds
// checks; stride 2 then keeps every other row and column of the stride-1 result.
__attribute__((target("avx2,fma"))) void depthwise3x3PaddedPlaneAvx2(float* y, const float* x, const float* wc, int64_t H, int64_t W, int64_t S,
                                                                      int64_t OH, int64_t OW) {
    const int64_t Wp = W + 2, n = H * Wp;  // flat outputs: row r, column c at r * Wp + c
    thread_local std::vector<float> xp, full;
    xp.assign(static_cast<size_t>((H + 2) * Wp + 16), 0.0f);  // the last vector reads up to 10 past the padded plane
    full.resize(static_cast<size_t>(n + 8));
    for (int64_t h = 0; h < H; ++h) std::memcpy(xp.data() + (h + 1) * Wp + 1, x + h * W, static_cast<size_t>(W) * sizeof(float));
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_broadcast_ss(wc + i);
    for (int64_t j = 0; j < n; j += 8) {
        const float* r = xp.data() + j;
        __m256 acc = _mm256_mul_ps(w[0], _mm256_loadu_ps(r));
        acc = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(r + 1), acc);
        acc = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(r + 2), acc);
        acc = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(r + Wp), acc);
        acc = _mm256_fmadd_ps(w[4], _mm256_loadu_ps(r + Wp + 1), acc);
        acc = _mm256_fmadd_ps(w[5], _mm256_loadu_ps(r + Wp + 2), acc);
        acc = _mm256_fmadd_ps(w[6], _mm256_loadu_ps(r + 2 * Wp), acc);
        acc = _mm256_fmadd_ps(w[7], _mm256_loadu_ps(r + 2 * Wp + 1), acc);
        acc = _mm256_fmadd_ps(w[8], _mm256_loadu_ps(r + 2 * Wp + 2), acc);
        _mm256_storeu_ps(full.data() + j, acc);
    }
    for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) y[oh * OW + ow] = full[static_cast<size_t>(oh * S * Wp + ow * S)];
}

// A 3x3, pad-1, stride-1 depthwise channel on a plane at most 8 wide (MobileNet's 7x7): one
// vector per output row, each input row's three taps as masked loads whose lanes outside
// the row read nothing (no fault, zero), so no output takes scalar border code.
__attribute__((target("avx2,fma"))) void depthwise3x3NarrowPlaneAvx2(float* y, const float* x, const float* wc, int64_t H, int64_t W) {
    alignas(32) int32_t left[8], mid[8], right[8];  // lane i reads column i - 1, i, i + 1
    for (int64_t i = 0; i < 8; ++i) left[i] = i >= 1 && i < W ? -1 : 0, mid[i] = i < W ? -1 : 0, right[i] = i + 1 < W ? -1 : 0;
    const __m256i ml = _mm256_load_si256(reinterpret_cast<const __m256i*>(left)), mm = _mm256_load_si256(reinterpret_cast<const __m256i*>(mid)),
                  mr = _mm256_load_si256(reinterpret_cast<const __m256i*>(right));
    __m256 w[9];
    for (int i = 0; i < 9; ++i) w[i] = _mm256_broadcast_ss(wc + i);
    alignas(32) float row[8];
    for (int64_t oh = 0; oh < H; ++oh) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t kh = 0; kh < 3; ++kh) {
            const int64_t ih = oh + kh - 1;
            if (ih < 0 || ih >= H) continue;
            const float* r = x + ih * W;
            acc = _mm256_fmadd_ps(w[kh * 3], _mm256_maskload_ps(r - 1, ml), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 1], _mm256_maskload_ps(r, mm), acc);
            acc = _mm256_fmadd_ps(w[kh * 3 + 2], _mm256_maskload_ps(r + 1, mr), acc);
        }
        _mm256_store_ps(row, acc);
        std::memcpy(y + oh * W, row, static_cast<size_t>(W) * sizeof(float));
    }
}

using DepthwiseRowFn = void (*)(float*, const float* const*, const float*, int64_t, int64_t, int64_t);

DepthwiseRowFn specializedDepthwise(const Conv2d& g) {
    if (g.dh != 1 || g.dw != 1 || g.KH != g.KW || g.sh != g.sw) return nullptr;
    const bool avx2 = cpuHasAvx2Fma();
    if (g.KH == 3 && g.sh == 1) return avx2 ? depthwiseRowAvx2<3, 1> : depthwiseRow<3, 1>;
    if (g.KH == 3 && g.sh == 2) return avx2 ? depthwise3x3Stride2RowAvx2 : depthwiseRow<3, 2>;
    if (g.KH == 5 && g.sh == 1) return avx2 ? depthwiseRowAvx2<5, 1> : depthwiseRow<5, 1>;
    if (g.KH == 5 && g.sh == 2) return avx2 ? depthwiseRowAvx2<5, 2> : depthwiseRow<5, 2>;
    return nullptr;
}

std::vector<Tensor> depthwiseConv(const KernelContext& ctx) {
    Conv2d g;
    if (!conv2dGeometry(ctx, &g) || g.group != g.C || g.M != g.C) return referenceFallback(ctx);
    const float* x = ctx.input(0).data<float>();
    const float* w = ctx.input(1).data<float>();
    Tensor y = ctx.output(0, DType::F32, {g.N, g.M, g.OH, g.OW});
    float* py = y.data<float>();
    const DepthwiseRowFn row_kernel = specializedDepthwise(g);
    // Flat-plane stencils for 3x3 pad-1 convs: at stride 1 over the plane itself, row vectors
    // with masked loads up to 8 wide, or over a zero-bordered copy
    // (depthwise3x3PaddedPlaneAvx2) for 9- to 16-wide planes; at stride 2
    // on planes too narrow for the vector rows (under 16 outputs wide) over the copy, as the
    // stride-1 result at even rows and columns (4x the arithmetic, all of it in vectors).
    const bool pad1 = g.KH == 3 && g.KW == 3 && g.dh == 1 && g.dw == 1 && g.pt == 1 && g.pl == 1 && g.H >= 3 && g.W >= 3 && cpuHasAvx2Fma();
    const bool plane_kernel = pad1 && g.sh == 1 && g.sw == 1 && g.OH == g.H && g.OW == g.W;
    const bool subsampled_plane = pad1 && g.sh == 2 && g.sw == 2 && g.OH == (g.H - 1) / 2 + 1 && g.OW == (g.W - 1) / 2 + 1 && g.OW < 16;
    // The zero-bordered copy for stride 2 on small planes and for stride 1 on 9- to 16-wide
    // ones, per channel (2 cores, median of six paired runs): 576 channels 14x14 -> 7x7 at
    // stride 2 121 -> 82 us; 384 channels 14x14 105 -> 87 us (batch 8: 697 -> 594); but 960
    // channels 7x7 54 -> 66 us, where the copy costs more than the border code it saves.
    const bool padded_plane = subsampled_plane || (plane_kernel && g.W > 8 && g.W <= 16);
    // Planes up to 8 wide at stride 1: one masked vector per row (960 channels 7x7, paired runs:
    // 103 -> 74 us; batch 8 635 -> 491 us).
    const bool narrow_plane = plane_kernel && g.W <= 8;
    const bool specialized = plane_kernel || subsampled_plane || row_kernel;  // else the generic loops
    const std::vector<float> zero_row(static_cast<size_t>(g.W), 0.0f);
    const Tensor* bias = ctx.optionalInput(2);
    const Tensor* residual = ctx.node.op_type == "FusedConv" ? ctx.optionalInput(3) : nullptr;
    const Activation act = ctx.node.op_type == "FusedConv" ? Activation::fromNode(ctx.node) : Activation{};
    const int64_t plane = g.OH * g.OW;
#pragma omp parallel for schedule(static)
    for (int64_t nc = 0; nc < g.N * g.C; ++nc) {
        const int64_t c = nc % g.C;
        const float* xc = x + nc * g.H * g.W;
        const float* wc = w + c * g.KH * g.KW;
        float* yc = py + nc * plane;
        if (narrow_plane) {
            depthwise3x3NarrowPlaneAvx2(yc, xc, wc, g.H, g.W);
        } else if (padded_plane) {
            depthwise3x3PaddedPlaneAvx2(yc, xc, wc, g.H, g.W, g.sh, g.OH, g.OW);
        } else if (plane_kernel) {
            depthwise3x3PlaneAvx2(yc, xc, wc, g.H, g.W);
        } else if (row_kernel) {
            const float* rows[5];
            for (int64_t oh = 0; oh < g.OH; ++oh) {
                for (int64_t kh = 0; kh < g.KH; ++kh) {
                    const int64_t ih = oh * g.sh - g.pt + kh;
                    rows[kh] = (ih < 0 || ih >= g.H) ? zero_row.data() : xc + ih * g.W;
                }
                row_kernel(yc + oh * g.OW, rows, wc, g.OW, g.W, g.pl);
            }
        }
        if (specialized) {  // the epilogue while the channel's plane is still in cache
            applyEpilogueSerial(yc, 1, plane, bias ? bias->data<float>() + c : nullptr, true, residual ? residual->data<float>() + nc * plane : nullptr, act);
            continue;
        }
        for (int64_t oh = 0; oh < g.OH; ++oh) {
            float* yr = yc + oh * g.OW;
            std::fill(yr, yr + g.OW, 0.0f);
            for (int64_t kh = 0; kh < g.KH; ++kh) {
                const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
                if (ih < 0 || ih >= g.H) continue;
                const float* xr = xc + ih * g.W;
                for (int64_t kw = 0; kw < g.KW; ++kw) {
                    const float wv = wc[kh * g.KW + kw];
                    const int64_t off = kw * g.dw - g.pl;
                    // Output columns whose input column is inside the row.
                    int64_t lo = off < 0 ? (-off + g.sw - 1) / g.sw : 0;
                    int64_t hi = g.W - 1 - off < 0 ? 0 : std::min(g.OW, (g.W - 1 - off) / g.sw + 1);
                    if (g.sw == 1)
                        for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xr[ow + off];
                    else
                        for (int64_t ow = lo; ow < hi; ++ow) yr[ow] += wv * xr[ow * g.sw + off];
                }
            }
        }
    }
    if (!specialized)
        for (int64_t n = 0; n < g.N; ++n) blockEpilogue(ctx, g, y, n, 0, g.M, 0, plane);
    return {y};
}

}  // namespace

// Registered before the other conv tactics: the better guess when shapes are unknown and
// nothing is timed.
void addDepthwiseConvTactics(std::vector<Tactic>& t) { t.push_back({"depthwise", "conv", {"Conv", "FusedConv"}, supportsDepthwise, depthwiseConv}); }

}  // namespace kiln
