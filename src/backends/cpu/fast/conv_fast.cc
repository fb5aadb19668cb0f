// 2-D convolutions (NCHW, f32) for the fast CPU backend:
//   gemm      — 1x1 stride-1 convs as one sgemm per group; others via im2col + sgemm
//               (gemm_dnnl: the same with oneDNN's sgemm, when built with it);
//   direct    — stride-1/2 convs computed in place from a zero-padded copy of the input,
//               4 output channels x 16 columns in AVX2 registers (no im2col, no packing:
//               wins where channels are few and sgemm's setup dominates);
//   depthwise — one filter per channel, direct loops parallel over channels.
// All fuse bias, residual and activation (FusedConv) into the epilogue.
#include <immintrin.h>

#include <cstring>

#include <limits>

#include "backends/cpu/fast/conv_geometry.h"
#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

bool conv2dNode(const Node& n) {
    if (n.op_type != "Conv" && n.op_type != "FusedConv") return false;
    if (n.attrs.getString("data_layout", "NCHW") != "NCHW") return false;
    auto k = n.attrs.getInts("kernel_shape");
    return k.empty() || k.size() == 2;
}

bool conv2dGeometry(const KernelContext& ctx, Conv2d* g) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    if (x.dtype() != DType::F32 || w.dtype() != DType::F32 || x.rank() != 4 || w.rank() != 4) return false;
    const Attributes& a = ctx.attrs();
    auto strides = a.getInts("strides", {1, 1}), dil = a.getInts("dilations", {1, 1});
    Dims kernel = {w.dims()[2], w.dims()[3]};
    SpatialPads pads = resolvePads(ctx, {x.dims()[2], x.dims()[3]}, kernel, strides, dil);
    *g = {x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3], w.dims()[0], w.dims()[2], w.dims()[3], 0, 0,
          a.getInt("group", 1), strides[0], strides[1], dil[0], dil[1], pads.begin[0], pads.begin[1]};
    g->OH = (g->H + pads.begin[0] + pads.end[0] - ((g->KH - 1) * g->dh + 1)) / g->sh + 1;
    g->OW = (g->W + pads.begin[1] + pads.end[1] - ((g->KW - 1) * g->dw + 1)) / g->sw + 1;
    if (g->OH <= 0 || g->OW <= 0 || g->C % g->group || g->M % g->group || w.dims()[1] * g->group != g->C) return false;
    if (const Tensor* b = ctx.optionalInput(2); b && (b->dtype() != DType::F32 || b->numel() != g->M)) return false;
    if (const Tensor* z = ctx.optionalInput(3); z && (z->dtype() != DType::F32 || z->dims() != Dims{g->N, g->M, g->OH, g->OW})) return false;
    return true;
}

namespace {

bool supportsGemmConv(const Node& n, const Graph&) { return conv2dNode(n); }
// Depthwise: one input channel per group and one filter per channel (weights [C, 1, kh, kw]).
bool supportsDepthwise(const Node& n, const Graph& g) {
    if (!conv2dNode(n) || n.inputs.size() < 2) return false;
    auto w = g.initializers.find(n.inputs[1]);
    return w != g.initializers.end() && w->second.rank() == 4 && w->second.dims()[1] == 1 && w->second.dims()[0] == n.attrs.getInt("group", 1);
}

std::vector<Tensor> fallback(const KernelContext& ctx) { return referenceKernels().find(ctx.node.op_type)(ctx); }

// The epilogue of output channels [m0, m0+mc) and columns [c0, c0+nc) of image n.
void blockEpilogue(const KernelContext& ctx, const Conv2d& g, Tensor& y, int64_t n, int64_t m0, int64_t mc, int64_t c0, int64_t nc) {
    const Tensor* b = ctx.optionalInput(2);
    const Tensor* z = ctx.node.op_type == "FusedConv" ? ctx.optionalInput(3) : nullptr;
    const Activation act = ctx.node.op_type == "FusedConv" ? Activation::fromNode(ctx.node) : Activation{};
    const int64_t P = g.OH * g.OW;
    if (nc == P) {  // whole channels: one call over the rows of image n
        const int64_t off = (n * g.M + m0) * P;
        applyEpilogue(y.data<float>() + off, mc, P, b ? b->data<float>() + m0 : nullptr, true, z ? z->data<float>() + off : nullptr, act);
        return;
    }
    // A column block of every channel: rows in parallel (on one thread this pass took longer
    // than the block's GEMM for MobileNet's wide 1x1 convs).
#pragma omp parallel for schedule(static) if (mc * nc > 32768)
    for (int64_t m = m0; m < m0 + mc; ++m) {
        const int64_t off = (n * g.M + m) * P + c0;
        applyEpilogueSerial(y.data<float>() + off, 1, nc, b ? b->data<float>() + m : nullptr, true, z ? z->data<float>() + off : nullptr, act);
    }
}

// A 1x1 conv over a batch of small planes as one sgemm: the images' inputs side by side as
// [C][N * P], W x that, then each image's [M][P] back in place with the epilogue. One sgemm
// as wide as the batch instead of N narrow ones (7x7 planes give sgemm 49 columns).
std::vector<Tensor> foldedPointwise(const KernelContext& ctx, const Conv2d& g, SgemmFn sgemm, Tensor y) {
    const float* x = ctx.input(0).data<float>();
    const float* w = ctx.input(1).data<float>();
    const int64_t P = g.OH * g.OW, NP = g.N * P;
    thread_local std::vector<float> scratch;  // the caller's; the parallel loops below use its pointers
    scratch.resize(static_cast<size_t>((g.C + g.M) * NP));
    float *xs = scratch.data(), *ys = xs + g.C * NP, *py = y.data<float>();
#pragma omp parallel for schedule(static) collapse(2) if (g.C * NP > 32768)
    for (int64_t c = 0; c < g.C; ++c)
        for (int64_t n = 0; n < g.N; ++n) std::memcpy(xs + c * NP + n * P, x + (n * g.C + c) * P, static_cast<size_t>(P) * sizeof(float));
    sgemm(false, false, g.M, NP, g.C, 1.0f, w, g.C, xs, NP, 0.0f, ys, NP);
#pragma omp parallel for schedule(static) collapse(2) if (g.M * NP > 32768)
    for (int64_t n = 0; n < g.N; ++n)
        for (int64_t m = 0; m < g.M; ++m) std::memcpy(py + (n * g.M + m) * P, ys + m * NP + n * P, static_cast<size_t>(P) * sizeof(float));
    for (int64_t n = 0; n < g.N; ++n) blockEpilogue(ctx, g, y, n, 0, g.M, 0, P);
    return {y};
}

std::vector<Tensor> gemmConvWith(const KernelContext& ctx, SgemmFn sgemm) {
    Conv2d g;
    if (!conv2dGeometry(ctx, &g)) return fallback(ctx);
    const float* x = ctx.input(0).data<float>();
    const float* w = ctx.input(1).data<float>();
    Tensor y = ctx.output(0, DType::F32, {g.N, g.M, g.OH, g.OW});
    float* py = y.data<float>();
    const int64_t cpg = g.C / g.group, mpg = g.M / g.group, K = cpg * g.KH * g.KW, P = g.OH * g.OW;
    const bool pointwise = g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0;
    // Batches of planes up to 8x8 as one sgemm. Batch 8, oneDNN, median of four paired runs on
    // 2 cores: 7x7 planes 320 -> 1280 channels 2.84 -> 2.42 ms, 160 -> 960 1.43 -> 1.19; 14x14
    // planes gained nothing (64 -> 384: 0.91 vs 0.97) and 28x28 lost (32 -> 192: 0.79 vs 1.12).
    if (pointwise && g.group == 1 && g.N > 1 && P <= 64) return foldedPointwise(ctx, g, sgemm, std::move(y));
    std::vector<float> cols(pointwise ? 0 : static_cast<size_t>(K * P));
    for (int64_t n = 0; n < g.N; ++n)
        for (int64_t grp = 0; grp < g.group; ++grp) {
            const float* xg = x + (n * g.C + grp * cpg) * g.H * g.W;
            const float* src = xg;
            if (!pointwise) {
                // cols[(c*KH + kh)*KW + kw, oh*OW + ow] = x[c, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw]
#pragma omp parallel for schedule(static)
                for (int64_t row = 0; row < K; ++row) {
                    const int64_t c = row / (g.KH * g.KW), kh = (row / g.KW) % g.KH, kw = row % g.KW;
                    float* dst = cols.data() + row * P;
                    for (int64_t oh = 0; oh < g.OH; ++oh) {
                        const int64_t ih = oh * g.sh - g.pt + kh * g.dh;
                        float* d = dst + oh * g.OW;
                        if (ih < 0 || ih >= g.H) {
                            std::fill(d, d + g.OW, 0.0f);
                            continue;
                        }
                        const float* s = xg + (c * g.H + ih) * g.W;
                        for (int64_t ow = 0; ow < g.OW; ++ow) {
                            const int64_t iw = ow * g.sw - g.pl + kw * g.dw;
                            d[ow] = (iw >= 0 && iw < g.W) ? s[iw] : 0.0f;
                        }
                    }
                }
                src = cols.data();
            }
            // Column blocks of about 2 MB of output: each block's output is still in cache (L2/L3)
            // when its epilogue runs, and few enough sgemm calls that their setup stays small.
            const int64_t block = std::max<int64_t>(256, (int64_t{1} << 19) / std::max<int64_t>(mpg, 1));
            float* yg = py + (n * g.M + grp * mpg) * P;
            for (int64_t c0 = 0; c0 < P; c0 += block) {
                const int64_t nc = std::min(block, P - c0);
                sgemm(false, false, mpg, nc, K, 1.0f, w + grp * mpg * K, K, src + c0, P, 0.0f, yg + c0, P);
                blockEpilogue(ctx, g, y, n, grp * mpg, mpg, c0, nc);
            }
        }
    return {y};
}

std::vector<Tensor> gemmConv(const KernelContext& ctx) { return gemmConvWith(ctx, blasSgemm); }
#ifdef KILN_WITH_DNNL
std::vector<Tensor> dnnlGemmConv(const KernelContext& ctx) { return gemmConvWith(ctx, dnnlSgemm); }
#endif

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
    if (!conv2dGeometry(ctx, &g) || g.group != g.C || g.M != g.C) return fallback(ctx);
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

constexpr int64_t kDirectChannels = 4, kDirectCols = 16;

// What directRow adds before storing (pointers already offset to the row's first channel).
struct DirectEpilogue {
    const float* bias = nullptr;
    const float* residual = nullptr;
    bool clamp = false;  // Relu or Clip: clamp to [lo, hi]
    bool keep_nan = false;  // Clip keeps NaN, Relu maps it to 0 (as the reference activations do)
    float lo = 0.0f, hi = 0.0f;
};

bool supportsDirect(const Node& n, const Graph& g) {
    if (!cpuHasAvx2Fma() || !conv2dNode(n) || n.attrs.getInt("group", 1) != 1 || n.inputs.size() < 2) return false;
    const auto strides = n.attrs.getInts("strides", {1, 1});
    if (strides.size() != 2 || strides[0] != strides[1] || strides[0] < 1 || strides[0] > 2) return false;
    for (int64_t v : n.attrs.getInts("dilations", {1, 1}))
        if (v != 1) return false;
    // 1x1 convs are already one sgemm without im2col: nothing for direct to save.
    auto w = g.initializers.find(n.inputs[1]);
    return w != g.initializers.end() && w->second.rank() == 4 && w->second.dims()[2] * w->second.dims()[3] > 1;
}

// Output rows oh of channels [m0, m0 + 4) of one image: y[m][oh][ow] = sum over c, kh, kw of
// wp[c][kh][kw][m - m0] * x_padded[c][oh * S + kh][ow * S + kw]. The padded input is split
// into S column phases, xp[c][row][kw % S][ow + kw / S], so every tap reads 16 consecutive
// floats; it is padded so that every 16-column block reads inside it, and partial blocks go
// through `tail`. KW and the stride are template parameters (KW 0: any, read from kw_any),
// so the tap loop unrolls and the 8 accumulators stay in registers.
template <int KW_FIXED, int S>
__attribute__((target("avx2,fma"))) void directRow(const float* xp, int64_t C, int64_t Hp, int64_t Wp, const float* wp, int64_t KH, int64_t kw_any,
                                                    int64_t oh, int64_t OW, int64_t mc, float* y0, int64_t P, const DirectEpilogue& epi) {
    const int64_t KW = KW_FIXED > 0 ? KW_FIXED : kw_any;
    alignas(32) float tail[kDirectChannels][kDirectCols];
    for (int64_t ow = 0; ow < OW; ow += kDirectCols) {
        // Named accumulators, pointers stepped: with an indexed acc[4][2] GCC stored all eight
        // to the stack on every kernel row (small_cnn at batch 16: 0.569 -> 0.475 ms).
        static_assert(kDirectChannels == 4, "one named accumulator pair per channel");
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        const float* wr = wp;
        for (int64_t c = 0; c < C; ++c) {
            const float* xr = xp + (c * Hp + oh * S) * S * Wp + ow;
            for (int64_t kh = 0; kh < KH; ++kh, xr += S * Wp) {
#pragma GCC unroll 7
                for (int64_t kw = 0; kw < KW; ++kw, wr += kDirectChannels) {
                    const float* xt = xr + (kw % S) * Wp + kw / S;
                    const __m256 x0 = _mm256_loadu_ps(xt), x1 = _mm256_loadu_ps(xt + 8);
                    __m256 wv = _mm256_broadcast_ss(wr);
                    a00 = _mm256_fmadd_ps(wv, x0, a00), a01 = _mm256_fmadd_ps(wv, x1, a01);
                    wv = _mm256_broadcast_ss(wr + 1);
                    a10 = _mm256_fmadd_ps(wv, x0, a10), a11 = _mm256_fmadd_ps(wv, x1, a11);
                    wv = _mm256_broadcast_ss(wr + 2);
                    a20 = _mm256_fmadd_ps(wv, x0, a20), a21 = _mm256_fmadd_ps(wv, x1, a21);
                    wv = _mm256_broadcast_ss(wr + 3);
                    a30 = _mm256_fmadd_ps(wv, x0, a30), a31 = _mm256_fmadd_ps(wv, x1, a31);
                }
            }
        }
        __m256 acc[kDirectChannels][2] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31}};
        // Bias, residual and a Relu/Clip in registers; other activations run after the row.
        const __m256 lo = _mm256_set1_ps(epi.lo), hi = _mm256_set1_ps(epi.hi);
        const int64_t n = std::min(kDirectCols, OW - ow);
        for (int64_t j = 0; j < mc; ++j) {
            const __m256 bias = _mm256_set1_ps(epi.bias ? epi.bias[j] : 0.0f);
            for (int h = 0; h < 2; ++h) {
                acc[j][h] = _mm256_add_ps(acc[j][h], bias);
                if (epi.residual && ow + 8 * h < OW) {
                    const float* r = epi.residual + j * P + oh * OW + ow + 8 * h;
                    alignas(32) float part[8] = {};
                    std::copy(r, r + std::min<int64_t>(8, OW - ow - 8 * h), part);
                    acc[j][h] = _mm256_add_ps(acc[j][h], _mm256_load_ps(part));
                }
                // max/min_ps return their second operand when either is NaN.
                if (epi.clamp) acc[j][h] = epi.keep_nan ? _mm256_min_ps(hi, _mm256_max_ps(lo, acc[j][h])) : _mm256_min_ps(_mm256_max_ps(acc[j][h], lo), hi);
            }
        }
        for (int64_t j = 0; j < mc; ++j) {
            float* dst = y0 + j * P + oh * OW + ow;
            if (n == kDirectCols) {
                _mm256_storeu_ps(dst, acc[j][0]), _mm256_storeu_ps(dst + 8, acc[j][1]);
            } else {
                _mm256_store_ps(tail[j], acc[j][0]), _mm256_store_ps(tail[j] + 8, acc[j][1]);
                std::copy(tail[j], tail[j] + n, dst);
            }
        }
    }
}

std::vector<Tensor> directConv(const KernelContext& ctx) {
    Conv2d g;
    if (!conv2dGeometry(ctx, &g) || g.group != 1 || g.sh != g.sw || g.sh < 1 || g.sh > 2 || g.dh != 1 || g.dw != 1) return gemmConv(ctx);
    const float* x = ctx.input(0).data<float>();
    const float* w = ctx.input(1).data<float>();
    Tensor y = ctx.output(0, DType::F32, {g.N, g.M, g.OH, g.OW});
    float* py = y.data<float>();
    const int64_t P = g.OH * g.OW, KK = g.KH * g.KW;
    // Padded input; columns rounded up so the last 16-column block reads zeros, not past the end.
    // Hp rows of S phases of Wp columns per channel.
    const int64_t S = g.sh, Hp = (g.OH - 1) * S + g.KH, Wp = (g.OW + kDirectCols - 1) / kDirectCols * kDirectCols + g.KW / S + 8;
    std::vector<float> xp(static_cast<size_t>(g.N * g.C * Hp * S * Wp), 0.0f);
    // Weights as [channel block][c][kh][kw][4 channels], zeros past M.
    const int64_t blocks = (g.M + kDirectChannels - 1) / kDirectChannels;
    std::vector<float> wp(static_cast<size_t>(blocks * g.C * KK * kDirectChannels), 0.0f);
    for (int64_t m = 0; m < g.M; ++m)
        for (int64_t ck = 0; ck < g.C * KK; ++ck) wp[((m / kDirectChannels) * g.C * KK + ck) * kDirectChannels + m % kDirectChannels] = w[m * g.C * KK + ck];
    // Tiny inputs are padded on one thread: a parallel region would cost more than the copy
    // (from 4K elements it pays: small_cnn 0.475 -> 0.448 ms at batch 16, 0.083 -> 0.080 at 2).
    // Rows are the unit of work (an RGB input has only 3 channels to share out).
#pragma omp parallel for schedule(static) collapse(2) if (g.N * g.C * g.H * g.W > 4096)
    for (int64_t nc = 0; nc < g.N * g.C; ++nc)
        for (int64_t h = 0; h < g.H; ++h) {
            const int64_t ph = h + g.pt;
            if (ph < 0 || ph >= Hp) continue;
            const float* src = x + (nc * g.H + h) * g.W;
            float* dst = xp.data() + (nc * Hp + ph) * S * Wp;
            if (S == 1) {  // one phase: the row's columns that land inside, in one copy
                const int64_t lo = std::max<int64_t>(0, -g.pl), hi = std::min<int64_t>(g.W, Wp - g.pl);
                if (hi > lo) std::memcpy(dst + lo + g.pl, src + lo, static_cast<size_t>(hi - lo) * sizeof(float));
                continue;
            }
            // Stride 2: columns start, start + 2, ... all land in one phase, consecutively.
            for (int64_t start = 0; start < 2; ++start) {
                int64_t wcol = start, pw = start + g.pl;
                while (pw < 0 && wcol < g.W) wcol += 2, pw += 2;
                float* d = dst + (pw % 2) * Wp;
                for (int64_t k = pw / 2; wcol < g.W && k < Wp; wcol += 2, ++k) d[k] = src[wcol];
            }
        }
    const Tensor* b = ctx.optionalInput(2);
    const Tensor* z = ctx.node.op_type == "FusedConv" ? ctx.optionalInput(3) : nullptr;
    const Activation act = ctx.node.op_type == "FusedConv" ? Activation::fromNode(ctx.node) : Activation{};
    using RowFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*, int64_t,
                           const DirectEpilogue&);
    const bool in_registers = act.kind == ActKind::None || act.kind == ActKind::Relu || act.kind == ActKind::Clip;
    const RowFn row = S == 1 ? (g.KW == 3 ? directRow<3, 1> : g.KW == 5 ? directRow<5, 1> : g.KW == 7 ? directRow<7, 1> : directRow<0, 1>)
                             : (g.KW == 3 ? directRow<3, 2> : g.KW == 5 ? directRow<5, 2> : g.KW == 7 ? directRow<7, 2> : directRow<0, 2>);
    // Channel blocks innermost: the KH input rows of an output row stay in L1 across them.
#pragma omp parallel for schedule(static) collapse(3)
    for (int64_t n = 0; n < g.N; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t blk = 0; blk < blocks; ++blk) {
                const int64_t m0 = blk * kDirectChannels, mc = std::min(kDirectChannels, g.M - m0);
                float* y0 = py + (n * g.M + m0) * P;
                DirectEpilogue epi;
                if (in_registers) {
                    epi.bias = b ? b->data<float>() + m0 : nullptr;
                    epi.residual = z ? z->data<float>() + (n * g.M + m0) * P : nullptr;
                    epi.clamp = act.kind != ActKind::None;
                    epi.keep_nan = act.kind == ActKind::Clip;
                    epi.lo = act.kind == ActKind::Clip ? act.a : 0.0f;
                    epi.hi = act.kind == ActKind::Clip ? act.b : std::numeric_limits<float>::infinity();
                }
                row(xp.data() + n * g.C * Hp * S * Wp, g.C, Hp, Wp, wp.data() + blk * g.C * KK * kDirectChannels, g.KH, g.KW, oh, g.OW, mc, y0, P, epi);
                for (int64_t j = 0; j < mc && !in_registers; ++j) {  // the epilogue while the rows are in cache
                    const int64_t off = (n * g.M + m0 + j) * P + oh * g.OW;
                    applyEpilogueSerial(py + off, 1, g.OW, b ? b->data<float>() + m0 + j : nullptr, true, z ? z->data<float>() + off : nullptr, act);
                }
            }
    return {y};
}

}  // namespace

void addConvTactics(std::vector<Tactic>& t) {
    // Depthwise first: it is the better guess when shapes are unknown and nothing is timed.
    t.push_back({"depthwise", "conv", {"Conv", "FusedConv"}, supportsDepthwise, depthwiseConv});
    t.push_back({"gemm", "conv", {"Conv", "FusedConv"}, supportsGemmConv, gemmConv});
    t.push_back({"direct", "conv", {"Conv", "FusedConv"}, supportsDirect, directConv});
#ifdef KILN_WITH_DNNL
    t.push_back({"gemm_dnnl", "conv", {"Conv", "FusedConv"}, supportsGemmConv, dnnlGemmConv});
#endif
}

}  // namespace kiln
