// 2-D convolutions (NCHW, f32) for the fast CPU backend (depthwise ones: conv_depthwise.cc):
//   gemm      — 1x1 stride-1 convs as one sgemm per group (a batch of small planes as one);
//               others via im2col + sgemm (gemm_dnnl: the same with oneDNN's sgemm, when
//               built with it);
//   direct    — stride-1/2 convs computed in place from a zero-padded copy of the input,
//               4 output channels x 16 columns in AVX2 registers (no im2col, no packing:
//               wins where channels are few and sgemm's setup dominates).
// All fuse bias, residual and activation (FusedConv) into the epilogue.
#include <immintrin.h>

#include <cstring>

#include <limits>

#include "backends/cpu/fast/conv_geometry.h"
#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/parallel_for.h"
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
    parallelFor(mc, mc * nc > 32768, [&](int64_t i) {
        const int64_t m = m0 + i, off = (n * g.M + m) * P + c0;
        applyEpilogueSerial(y.data<float>() + off, 1, nc, b ? b->data<float>() + m : nullptr, true, z ? z->data<float>() + off : nullptr, act);
    });
}

namespace {

bool supportsGemmConv(const Node& n, const Graph&) { return conv2dNode(n); }

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
    parallelFor(g.C * g.N, g.C * NP > 32768, [&](int64_t i) {
        const int64_t c = i / g.N, n = i % g.N;
        std::memcpy(xs + c * NP + n * P, x + (n * g.C + c) * P, static_cast<size_t>(P) * sizeof(float));
    });
    sgemm(false, false, g.M, NP, g.C, 1.0f, w, g.C, xs, NP, 0.0f, ys, NP);
    parallelFor(g.N * g.M, g.M * NP > 32768, [&](int64_t i) {
        const int64_t n = i / g.M, m = i % g.M;
        std::memcpy(py + i * P, ys + m * NP + n * P, static_cast<size_t>(P) * sizeof(float));
    });
    for (int64_t n = 0; n < g.N; ++n) blockEpilogue(ctx, g, y, n, 0, g.M, 0, P);
    return {y};
}

std::vector<Tensor> gemmConvWith(const KernelContext& ctx, SgemmFn sgemm) {
    Conv2d g;
    if (!conv2dGeometry(ctx, &g)) return referenceFallback(ctx);
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
    parallelFor(g.N * g.C * g.H, g.N * g.C * g.H * g.W > 4096, [&](int64_t row) {
        const int64_t nc = row / g.H, h = row % g.H, ph = h + g.pt;
        if (ph < 0 || ph >= Hp) return;
        const float* src = x + row * g.W;
        float* dst = xp.data() + (nc * Hp + ph) * S * Wp;
        if (S == 1) {  // one phase: the row's columns that land inside, in one copy
            const int64_t lo = std::max<int64_t>(0, -g.pl), hi = std::min<int64_t>(g.W, Wp - g.pl);
            if (hi > lo) std::memcpy(dst + lo + g.pl, src + lo, static_cast<size_t>(hi - lo) * sizeof(float));
            return;
        }
        // Stride 2: columns start, start + 2, ... all land in one phase, consecutively.
        for (int64_t start = 0; start < 2; ++start) {
            int64_t wcol = start, pw = start + g.pl;
            while (pw < 0 && wcol < g.W) wcol += 2, pw += 2;
            float* d = dst + (pw % 2) * Wp;
            for (int64_t k = pw / 2; wcol < g.W && k < Wp; wcol += 2, ++k) d[k] = src[wcol];
        }
    });
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
    t.push_back({"gemm", "conv", {"Conv", "FusedConv"}, supportsGemmConv, gemmConv});
    t.push_back({"direct", "conv", {"Conv", "FusedConv"}, supportsDirect, directConv});
#ifdef KILN_WITH_DNNL
    t.push_back({"gemm_dnnl", "conv", {"Conv", "FusedConv"}, supportsGemmConv, dnnlGemmConv});
#endif
}

}  // namespace kiln
