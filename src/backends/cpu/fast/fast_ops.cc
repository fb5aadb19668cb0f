// Fast f32 kernels for normalization, softmax, attention, pooling and activations. Each
// falls back to the reference kernel for shapes or types it does not cover.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/max_or_nan.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/sgemm.h"
#include "backends/cpu/fast/softmax_row.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/fast/transpose8x8.h"
#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

// In-place softmax of `rows` rows of `len` floats.
void softmaxRows(float* p, int64_t rows, int64_t len) {
    parallelFor(rows, rows * len > 16384, [&](int64_t r) { softmaxRow(p + r * len, len); });
}

std::vector<Tensor> fastSoftmax(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    int64_t axis = ctx.attrs().getInt("axis", ctx.opset < 13 ? 1 : -1);
    if (axis < 0) axis += rank;
    if (x.dtype() != DType::F32 || rank == 0 || axis != rank - 1) return referenceFallback(ctx);
    Tensor y = x.clone();
    const int64_t len = x.dims().back(), rows = len ? x.numel() / len : 0;
    float* p = y.data<float>();
    if (ctx.node.op_type == "LogSoftmax") parallelFor(rows, rows * len > 16384, [&](int64_t r) { logSoftmaxRow(p + r * len, len); });
    else softmaxRows(p, rows, len);
    return {y};
}

// One row: sums in double for the reference's accuracy on wide rows; `omp simd` lets them
// vectorize (a plain double reduction is a serial chain of dependent adds).
__attribute__((target_clones("avx512f", "avx2", "default"))) void layerNormRow(const float* xr, float* yr, int64_t len, const float* g, const float* b,
                                                                             float eps) {
    double mean = 0, var = 0;
#pragma omp simd reduction(+ : mean)
    for (int64_t j = 0; j < len; ++j) mean += xr[j];
    mean /= static_cast<double>(len);
#pragma omp simd reduction(+ : var)
    for (int64_t j = 0; j < len; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(len) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t j = 0; j < len; ++j) yr[j] = (xr[j] - m) * inv * g[j] + (b ? b[j] : 0.0f);
}

std::vector<Tensor> fastLayerNorm(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor* bias = ctx.optionalInput(2);
    const int64_t rank = static_cast<int64_t>(x.rank());
    int64_t axis = ctx.attrs().getInt("axis", -1);
    if (axis < 0) axis += rank;
    if (rank == 0 || x.dtype() != DType::F32 || scale.dtype() != DType::F32 || axis != rank - 1 || ctx.numOutputs() > 1) return referenceFallback(ctx);
    const int64_t len = x.dims().back();
    if (scale.numel() != len || (bias && (bias->dtype() != DType::F32 || bias->numel() != len))) return referenceFallback(ctx);
    const float eps = ctx.attrs().getFloat("epsilon", 1e-5f);
    Tensor y = ctx.output(0, DType::F32, x.dims());
    const float* px = x.data<float>();
    const float* g = scale.data<float>();
    const float* b = bias ? bias->data<float>() : nullptr;
    float* py = y.data<float>();
    const int64_t rows = len ? x.numel() / len : 0;
    parallelFor(rows, rows * len > 16384, [&](int64_t r) { layerNormRow(px + r * len, py + r * len, len, g, b, eps); });
    return {y};
}

// Attention(Q [.., S, D], Kt [.., D, T], V [.., T, E], mask), or with layout "bshd" Q [B, S, H, D],
// K [B, T, H, D], V [B, T, H, E] -> [B, S, H, E] (the transposes around it folded into the GEMMs'
// strides). One task per (batch, head, 32 query rows): its scores stay in the thread's cache
// between the two single-threaded sgemms and the softmax.
std::vector<Tensor> fastAttention(const KernelContext& ctx) {
    const Tensor& q = ctx.input(0);
    const Tensor& kt = ctx.input(1);
    const Tensor& v = ctx.input(2);
    const Tensor* mask = ctx.optionalInput(3);
    const bool bshd = ctx.attrs().getString("layout", "") == "bshd";
    if (q.dtype() != DType::F32 || kt.dtype() != DType::F32 || v.dtype() != DType::F32 || q.rank() < 2 || q.rank() != kt.rank() || q.rank() != v.rank())
        return referenceFallback(ctx);
    if ((mask && mask->dtype() != DType::F32) || (bshd && q.rank() != 4)) return referenceFallback(ctx);
    // Per (batch b, head h): element (row, col) of each operand at base + row * ld + col.
    int64_t B, H, S, D, T, E;
    Dims out_dims;
    if (bshd) {
        B = q.dims()[0], S = q.dims()[1], H = q.dims()[2], D = q.dims()[3], T = kt.dims()[1], E = v.dims()[3];
        if (kt.dims() != Dims{B, T, H, D} || v.dims() != Dims{B, T, H, E}) return referenceFallback(ctx);
        out_dims = {B, S, H, E};
    } else {
        const Dims batch(q.dims().begin(), q.dims().end() - 2);
        if (Dims(kt.dims().begin(), kt.dims().end() - 2) != batch || Dims(v.dims().begin(), v.dims().end() - 2) != batch) return referenceFallback(ctx);
        B = numElements(batch), H = 1, S = q.dims()[q.rank() - 2], D = q.dims().back(), T = kt.dims().back(), E = v.dims().back();
        if (kt.dims()[kt.rank() - 2] != D || v.dims()[v.rank() - 2] != T) return referenceFallback(ctx);
        out_dims = batch;
        out_dims.insert(out_dims.end(), {S, E});
    }
    const float scale = ctx.attrs().getFloat("scale", 1.0f);
    // The mask's offset at the start of each score row (canonical [B, H, S] order) and its
    // step along the keys (0 when broadcast): a row's T offsets are not tabulated one by one.
    std::vector<int64_t> mask_row;
    int64_t mask_step = 0;
    if (mask) {
        Dims row_dims = bshd ? Dims{B, H, S, 1} : Dims(q.dims().begin(), q.dims().end() - 2);
        if (!bshd) row_dims.insert(row_dims.end(), {S, 1});
        Dims mask_dims = mask->dims();
        if (mask_dims.empty()) mask_dims = {1};
        mask_step = mask_dims.back() == 1 ? 0 : 1;
        if (mask_step && mask_dims.back() != T) return referenceFallback(ctx);
        mask_dims.back() = 1;
        mask_row = broadcastOffsets(row_dims, mask_dims);  // in units of the mask's rows
        if (mask_step)
            for (auto& o : mask_row) o *= T;
    }
    Tensor out = ctx.output(0, DType::F32, out_dims);
    const float *pq = q.data<float>(), *pk = kt.data<float>(), *pv = v.data<float>(), *pm = mask ? mask->data<float>() : nullptr;
    float* po = out.data<float>();
    const int64_t ldq = bshd ? H * D : D, ldk = bshd ? H * D : T, ldv = bshd ? H * E : E, ldo = bshd ? H * E : E;
    // Tasks: (batch, head, block of query rows), so that few heads still fill every thread.
    const int64_t qrows = std::min<int64_t>(S, 32), qblocks = (S + qrows - 1) / qrows;
#pragma omp parallel
    {
        std::vector<float> scores(static_cast<size_t>(qrows * T));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < B * H * qblocks; ++task) {
            const int64_t bh = task / qblocks, s0 = task % qblocks * qrows, rows = std::min(qrows, S - s0);
            const int64_t b = bh / H, h = bh % H;
            const float* qb = pq + (bshd ? b * S * H * D + h * D : bh * S * D) + s0 * ldq;
            const float* kb = pk + (bshd ? b * T * H * D + h * D : bh * D * T);
            const float* vb = pv + (bshd ? b * T * H * E + h * E : bh * T * E);
            float* ob = po + (bshd ? b * S * H * E + h * E : bh * S * E) + s0 * ldo;
            kPreferredSgemm(false, bshd, rows, T, D, scale, qb, ldq, kb, ldk, 0.0f, scores.data(), T);
            if (pm) {
                for (int64_t r = 0; r < rows; ++r) {
                    const float* m = pm + mask_row[static_cast<size_t>(bh * S + s0 + r)];
                    float* sr = scores.data() + r * T;
                    if (mask_step) {
                        for (int64_t t = 0; t < T; ++t) sr[t] += m[t];
                    } else {
                        for (int64_t t = 0; t < T; ++t) sr[t] += m[0];
                    }
                }
            }
            softmaxRows(scores.data(), rows, T);
            kPreferredSgemm(false, false, rows, E, T, 1.0f, scores.data(), T, vb, ldv, 0.0f, ob, ldo);
        }
    }
    return {out};
}

// Outputs [0, n) of one 2x2 / stride-2 row, 8 at a time from rows r0 and r1; returns how
// many it wrote (the rest go through the scalar loop).
__attribute__((target("avx2"))) int64_t maxPool2x2RowAvx2(const float* r0, const float* r1, float* y, int64_t n) {
    int64_t ow = 0;
    for (; ow + 8 <= n; ow += 8) {
        const __m256 a = maxOrNan8(_mm256_loadu_ps(r0 + 2 * ow), _mm256_loadu_ps(r1 + 2 * ow));           // columns 2ow .. 2ow+7
        const __m256 b = maxOrNan8(_mm256_loadu_ps(r0 + 2 * ow + 8), _mm256_loadu_ps(r1 + 2 * ow + 8));   // 2ow+8 .. 2ow+15
        // Even and odd columns (lane order a0 a2 b0 b2 | a4 a6 b4 b6), their max, lanes back in order.
        const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        const __m256 m = maxOrNan8(even, odd);
        _mm256_storeu_ps(y + ow, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), _MM_SHUFFLE(3, 1, 2, 0))));
    }
    return ow;
}

// MaxPool over 2-D f32 NCHW without dilation or Indices output.
// A 2-D pooling window's geometry over NCHW f32 (dilation 1, one output); false for the
// rest, which the reference kernel takes.
struct Pool2d {
    int64_t N, C, H, W, OH, OW, kh, kw, sh, sw, pt, pl, pb, pr;
};
bool pool2dGeometry(const KernelContext& ctx, Pool2d* p) {
    const Tensor& x = ctx.input(0);
    const Attributes& a = ctx.attrs();
    if (x.dtype() != DType::F32 || x.rank() != 4 || ctx.numOutputs() > 1 || a.getInts("dilations", {1, 1}) != std::vector<int64_t>{1, 1}) return false;
    const auto k = a.getInts("kernel_shape");
    const auto st = a.getInts("strides", {1, 1});
    if (k.size() != 2 || st.size() != 2) return false;
    const int64_t H = x.dims()[2], W = x.dims()[3];
    SpatialPads pads = resolvePads(ctx, {H, W}, k, st, {1, 1});
    const bool ceil_mode = a.getInt("ceil_mode", 0) != 0;
    const std::string auto_pad = a.getString("auto_pad", "NOTSET");
    int64_t out[2];
    const int64_t in[2] = {H, W};
    for (int d = 0; d < 2; ++d) {
        if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
            out[d] = (in[d] + st[d] - 1) / st[d];
            continue;
        }
        const int64_t span = in[d] + pads.begin[d] + pads.end[d] - k[d];
        out[d] = (ceil_mode ? (span + st[d] - 1) / st[d] : span / st[d]) + 1;
        if (ceil_mode && (out[d] - 1) * st[d] >= in[d] + pads.begin[d]) --out[d];
    }
    if (out[0] <= 0 || out[1] <= 0) return false;
    *p = {x.dims()[0], x.dims()[1], H, W, out[0], out[1], k[0], k[1], st[0], st[1], pads.begin[0], pads.begin[1], pads.end[0], pads.end[1]};
    return true;
}

std::vector<Tensor> fastMaxPool(const KernelContext& ctx) {
    Pool2d g;
    if (!pool2dGeometry(ctx, &g)) return referenceFallback(ctx);
    const int64_t N = g.N, C = g.C, H = g.H, W = g.W;
    const int64_t out[2] = {g.OH, g.OW}, k[2] = {g.kh, g.kw}, st[2] = {g.sh, g.sw};
    Tensor y = ctx.output(0, DType::F32, {N, C, out[0], out[1]});
    const float* px = ctx.input(0).data<float>();
    float* py = y.data<float>();
    if (k[0] == 2 && k[1] == 2 && st[0] == 2 && st[1] == 2 && g.pt == 0 && g.pl == 0 && out[0] * 2 <= H && out[1] * 2 <= W) {
        // The common 2x2 / stride-2 window, with no padding inside the image: no bounds checks.
        // Parallel from 4K outputs (small_cnn's pool at batch 2, 8K outputs: 5.7 -> 3.9 us).
        const bool avx2 = cpuHasAvx2Fma();
        parallelFor(N * C, N * C * out[0] * out[1] > 4096, [&](int64_t nc) {
            for (int64_t oh = 0; oh < out[0]; ++oh) {
                const float* r0 = px + (nc * H + 2 * oh) * W;
                const float* r1 = r0 + W;
                float* yr = py + (nc * out[0] + oh) * out[1];
                const int64_t done = avx2 ? maxPool2x2RowAvx2(r0, r1, yr, out[1]) : 0;
                for (int64_t ow = done; ow < out[1]; ++ow)
                    yr[ow] = maxOrNan(maxOrNan(r0[2 * ow], r0[2 * ow + 1]), maxOrNan(r1[2 * ow], r1[2 * ow + 1]));
            }
        });
        return {y};
    }
    parallelFor(N * C, N * C * out[0] * out[1] > 4096, [&](int64_t nc) {
        for (int64_t oh = 0; oh < out[0]; ++oh)
            for (int64_t ow = 0; ow < out[1]; ++ow) {
                const int64_t h0 = std::max<int64_t>(oh * st[0] - g.pt, 0), h1 = std::min<int64_t>(oh * st[0] - g.pt + k[0], H);
                const int64_t w0 = std::max<int64_t>(ow * st[1] - g.pl, 0), w1 = std::min<int64_t>(ow * st[1] - g.pl + k[1], W);
                float m = -INFINITY;
                for (int64_t h = h0; h < h1; ++h)
                    for (int64_t w = w0; w < w1; ++w) m = maxOrNan(m, px[(nc * H + h) * W + w]);
                py[(nc * out[0] + oh) * out[1] + ow] = m;
            }
    });
    return {y};
}

// AveragePool: each window's sum over the image, divided by the window's size within the
// padded image (count_include_pad) or within the image. The row sums of an output row's
// window are taken once (a column of kh rows, summed per input column), then the kw-wide
// sums slide along it.
std::vector<Tensor> fastAveragePool(const KernelContext& ctx) {
    Pool2d g;
    if (!pool2dGeometry(ctx, &g)) return referenceFallback(ctx);
    const bool include_pad = ctx.attrs().getInt("count_include_pad", 0) != 0;
    Tensor y = ctx.output(0, DType::F32, {g.N, g.C, g.OH, g.OW});
    const float* px = ctx.input(0).data<float>();
    float* py = y.data<float>();
    parallelFor(g.N * g.C, g.N * g.C * g.OH * g.OW > 4096, [&](int64_t nc) {
        thread_local std::vector<double> cols;
        cols.resize(static_cast<size_t>(g.W));
        for (int64_t oh = 0; oh < g.OH; ++oh) {
            const int64_t hs = oh * g.sh - g.pt, h0 = std::max<int64_t>(hs, 0), h1 = std::min<int64_t>(hs + g.kh, g.H);
            std::fill(cols.begin(), cols.end(), 0.0);
            for (int64_t h = h0; h < h1; ++h) {
                const float* row = px + (nc * g.H + h) * g.W;
                for (int64_t w = 0; w < g.W; ++w) cols[w] += row[w];
            }
            const int64_t rows_in = h1 - h0, rows_padded = std::min<int64_t>(hs + g.kh, g.H + g.pb) - std::max<int64_t>(hs, -g.pt);
            float* yr = py + (nc * g.OH + oh) * g.OW;
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const int64_t ws = ow * g.sw - g.pl, w0 = std::max<int64_t>(ws, 0), w1 = std::min<int64_t>(ws + g.kw, g.W);
                double sum = 0;
                for (int64_t w = w0; w < w1; ++w) sum += cols[w];
                const int64_t cols_padded = std::min<int64_t>(ws + g.kw, g.W + g.pr) - std::max<int64_t>(ws, -g.pl);
                const int64_t count = include_pad ? rows_padded * cols_padded : rows_in * (w1 - w0);
                yr[ow] = count > 0 ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
            }
        }
    });
    return {y};
}

// GlobalAveragePool over f32: one mean per (n, c) plane.
std::vector<Tensor> fastGlobalAveragePool(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DType::F32 || x.rank() < 3) return referenceFallback(ctx);
    const int64_t planes = x.dims()[0] * x.dims()[1];
    const int64_t size = planes ? x.numel() / planes : 0;
    Dims out_dims(x.rank(), 1);
    out_dims[0] = x.dims()[0];
    out_dims[1] = x.dims()[1];
    Tensor y = ctx.output(0, DType::F32, out_dims);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    // Parallel from 8K inputs (small_cnn's at batch 2, 16K: 3.6 -> 2.6 us).
    parallelFor(planes, x.numel() > 8192, [&](int64_t p) {
        // Double sums (the reference's accuracy on large planes) in eight independent lanes:
        // one running sum would wait on the add latency at every element.
        const float* plane = px + p * size;
        double lanes[8] = {};
        int64_t i = 0;
        for (; i + 8 <= size; i += 8)
#pragma omp simd
            for (int j = 0; j < 8; ++j) lanes[j] += plane[i + j];
        double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        for (; i < size; ++i) sum += plane[i];
        py[p] = static_cast<float>(sum / static_cast<double>(std::max<int64_t>(size, 1)));
    });
    return {y};
}

// A transpose restated on the fewest axes: unit axes dropped, and input axes that stay
// neighbours in the output merged (NCHW -> NHWC is a batch of [C, HW] -> [HW, C]).
void coalescePermutation(const Dims& dims, const std::vector<int64_t>& perm, Dims* out_dims, std::vector<int64_t>* out_perm) {
    std::vector<int64_t> renamed(dims.size(), -1);
    int64_t kept = 0;
    for (size_t a = 0; a < dims.size(); ++a)
        if (dims[a] != 1) renamed[a] = kept++;
    std::vector<std::vector<int64_t>> groups;  // in output order, each a run of input axes
    for (int64_t p : perm) {
        if (renamed[p] < 0) continue;
        if (!groups.empty() && renamed[p] == groups.back().back() + 1) groups.back().push_back(renamed[p]);
        else groups.push_back({renamed[p]});
    }
    std::vector<size_t> by_input(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) by_input[g] = g;
    std::sort(by_input.begin(), by_input.end(), [&](size_t l, size_t r) { return groups[l].front() < groups[r].front(); });
    std::vector<int64_t> kept_dims;
    for (size_t a = 0; a < dims.size(); ++a)
        if (dims[a] != 1) kept_dims.push_back(dims[a]);
    out_dims->assign(groups.size(), 1);
    out_perm->assign(groups.size(), 0);
    for (size_t pos = 0; pos < by_input.size(); ++pos) {
        for (int64_t a : groups[by_input[pos]]) (*out_dims)[pos] *= kept_dims[a];
        (*out_perm)[by_input[pos]] = static_cast<int64_t>(pos);
    }
}

// dst[c][r] = src[r][c] over rows [r0, r1) and columns [c0, c1), both multiples of 8 long,
// of an R x C matrix of 4-byte elements, one 8 x 8 register transpose per block.
__attribute__((target("avx2"))) void transposeBlocks8(const uint32_t* src, uint32_t* dst, int64_t R, int64_t C, int64_t r0, int64_t r1, int64_t c0,
                                                     int64_t c1) {
    // Columns outside: each destination row is written in one run of the tile's rows, which
    // keeps those rows cached even when they lie a multiple of 4 KB apart (one cache set).
    for (int64_t c = c0; c < c1; c += 8)
        for (int64_t r = r0; r < r1; r += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + (r + i) * C + c));
            transpose8x8(v);
            for (int j = 0; j < 8; ++j) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (c + j) * R + r), v[j]);
        }
}

// The transpose of coalesced `dims` by `perm` for elements of type T (any of 1 to 8 bytes):
// a batch of 32 x 32 tiles where the last two axes swap (4-byte ones through 8 x 8 AVX2
// register blocks), row copies where the last axis stays, element gathers otherwise.
template <typename T>
void transposeElements(const T* px, T* py, const Dims& dims, const std::vector<int64_t>& perm, int64_t numel) {
    const size_t rank = dims.size();
    Dims out_dims(rank);
    for (size_t i = 0; i < rank; ++i) out_dims[i] = dims[perm[i]];
    const Dims in_strides = stridesOf(dims);
    const int64_t bytes = numel * static_cast<int64_t>(sizeof(T));
    bool swap_last_two = perm[rank - 1] == static_cast<int64_t>(rank - 2) && perm[rank - 2] == static_cast<int64_t>(rank - 1);
    for (size_t d = 0; d + 2 < rank; ++d) swap_last_two = swap_last_two && perm[d] == static_cast<int64_t>(d);
    if (swap_last_two) {  // a batch of R x C matrices: 32 x 32 tiles, each read and written through the cache
        constexpr int64_t kTile = 32;
        const int64_t R = dims[rank - 2], C = dims[rank - 1], batch = numel / std::max<int64_t>(R * C, 1);
        const int64_t tiles_r = (R + kTile - 1) / kTile, tiles_c = (C + kTile - 1) / kTile;
        const bool blocks8 = sizeof(T) == 4 && cpuHasAvx2Fma();
        parallelFor(batch * tiles_r * tiles_c, bytes > 262144, [&](int64_t t) {
            const int64_t b = t / (tiles_r * tiles_c), r0 = t / tiles_c % tiles_r * kTile, c0 = t % tiles_c * kTile;
            const int64_t r1 = std::min(R, r0 + kTile), c1 = std::min(C, c0 + kTile);
            const T* src = px + b * R * C;
            T* dst = py + b * R * C;
            // Whole 8 x 8 blocks in registers; the tile's ragged edges element by element.
            const int64_t r8 = blocks8 ? r0 + (r1 - r0) / 8 * 8 : r0, c8 = blocks8 ? c0 + (c1 - c0) / 8 * 8 : c0;
            if constexpr (sizeof(T) == 4)
                if (r8 > r0 && c8 > c0) transposeBlocks8(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst), R, C, r0, r8, c0, c8);
            for (int64_t c = c0; c < c1; ++c)
                for (int64_t r = (c < c8 ? r8 : r0); r < r1; ++r) dst[c * R + r] = src[r * C + c];
        });
        return;
    }
    const bool rows = perm[rank - 1] == static_cast<int64_t>(rank - 1);
    const size_t outer_rank = rows ? rank - 1 : rank;
    const int64_t row = rows ? out_dims[rank - 1] : 1;
    const int64_t count = numel / std::max<int64_t>(row, 1);
    parallelFor(count, bytes > 262144, [&](int64_t i) {
        int64_t rem = i, off = 0;
        for (int64_t d = static_cast<int64_t>(outer_rank) - 1; d >= 0; --d) {
            const int64_t idx = rem % out_dims[d];
            rem /= out_dims[d];
            off += idx * in_strides[perm[d]];
        }
        if (rows) std::memcpy(py + i * row, px + off, static_cast<size_t>(row) * sizeof(T));
        else py[i] = px[off];
    });
}

// Transpose of elements of 1, 2, 4 or 8 bytes (f32 activations, and the 8-bit tensors of
// quantized models) on the fewest axes that express it.
std::vector<Tensor> fastTranspose(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const size_t full_rank = x.rank();
    auto full_perm = ctx.attrs().getInts("perm");
    if (full_perm.empty())
        for (int64_t i = static_cast<int64_t>(full_rank) - 1; i >= 0; --i) full_perm.push_back(i);
    const size_t es = dtypeSize(x.dtype());
    if ((es != 1 && es != 2 && es != 4 && es != 8) || full_perm.size() != full_rank || full_rank < 2) return referenceFallback(ctx);
    for (auto& p : full_perm) p = normalizeAxis(p, static_cast<int64_t>(full_rank), ctx);
    Dims y_dims(full_rank);
    for (size_t i = 0; i < full_rank; ++i) y_dims[i] = x.dims()[full_perm[i]];
    Tensor y = ctx.output(0, x.dtype(), y_dims);
    Dims dims;
    std::vector<int64_t> perm;
    coalescePermutation(x.dims(), full_perm, &dims, &perm);
    if (dims.size() <= 1 || y.numel() == 0) {  // the same order: a copy
        std::memcpy(y.raw(), x.raw(), x.byteSize());
        return {y};
    }
    auto run = [&](auto tag) {
        using T = decltype(tag);
        transposeElements(reinterpret_cast<const T*>(x.raw()), reinterpret_cast<T*>(y.raw()), dims, perm, y.numel());
    };
    if (es == 1) run(uint8_t{});
    else if (es == 2) run(uint16_t{});
    else if (es == 4) run(uint32_t{});
    else run(uint64_t{});
    return {y};
}

// Standalone activation ops (Gelu, Relu, Sigmoid, ...) over f32, vectorized in chunks.
std::vector<Tensor> fastActivation(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    if (x.dtype() != DType::F32) return referenceFallback(ctx);
    const Node& n = ctx.node;
    Activation act;
    if (n.op_type == "Gelu") act.kind = n.attrs.getString("approximate", "none") == "tanh" ? ActKind::GeluTanh : ActKind::Gelu;
    else if (n.op_type == "Relu") act.kind = ActKind::Relu;
    else if (n.op_type == "Sigmoid") act.kind = ActKind::Sigmoid;
    else if (n.op_type == "Tanh") act.kind = ActKind::Tanh;
    else if (n.op_type == "Erf") act.kind = ActKind::Erf;
    else if (n.op_type == "HardSwish") act.kind = ActKind::HardSwish;
    else if (n.op_type == "LeakyRelu") act = Activation{ActKind::LeakyRelu, n.attrs.getFloat("alpha", 0.01f), 0};
    else return referenceFallback(ctx);
    Tensor y = ctx.output(0, DType::F32, x.dims());
    std::memcpy(y.raw(), x.raw(), x.byteSize());
    constexpr int64_t kChunk = 8192;
    const int64_t chunks = (x.numel() + kChunk - 1) / kChunk;
    float* py = y.data<float>();
    parallelFor(chunks, chunks > 4, [&](int64_t c) {
        applyEpilogueSerial(py + c * kChunk, 1, std::min(kChunk, x.numel() - c * kChunk), nullptr, false, nullptr, act);
    });
    return {y};
}

}  // namespace

void addFastOpTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "elementwise", {"Gelu", "Relu", "Sigmoid", "Tanh", "Erf", "HardSwish", "LeakyRelu"}, supportsAnyNode, fastActivation});
    t.push_back({"fast", "pool", {"MaxPool"}, supportsAnyNode, fastMaxPool});
    t.push_back({"fast", "pool", {"AveragePool"}, supportsAnyNode, fastAveragePool});
    t.push_back({"fast", "pool", {"GlobalAveragePool"}, supportsAnyNode, fastGlobalAveragePool});
    t.push_back({"fast", "data", {"Transpose"}, supportsAnyNode, fastTranspose});
    t.push_back({"fast", "norm", {"LayerNormalization", "Softmax", "LogSoftmax"}, supportsAnyNode, nullptr});
    t.back().kernel = [](const KernelContext& ctx) { return ctx.node.op_type == "LayerNormalization" ? fastLayerNorm(ctx) : fastSoftmax(ctx); };
    t.push_back({"fast", "attention", {"Attention"}, supportsAnyNode, fastAttention});
}

}  // namespace kiln
