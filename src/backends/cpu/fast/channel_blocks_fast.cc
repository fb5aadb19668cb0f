// Fast kernels of the channel-blocked layouts (channel_blocks.h, blocks of B = 8 or 16
// channels): the reorders at the ends of a blocked conv chain as 8x8 AVX2 transposes (8
// channel planes <-> 8 pixels of 8 lanes, B / 8 of them per block), one (image, channel
// block) per thread; and pooling on blocked data, 8 channels per AVX2 vector or 16 per AVX-512
// one, so that a chain does not leave the layout for a MaxPool or a global average.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/fast/max_or_nan.h"
#include "backends/cpu/fast/parallel_for.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/fast/transpose8x8.h"
#include "backends/cpu/reference/channel_blocks.h"
#include "backends/cpu/reference/kernel_util.h"

// GCC 12 takes the AVX-512 intrinsics' undefined pass-through operands for uninitialized
// variables (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln {

namespace {


// One channel block: `lanes` planes of HW floats (planes[l], lanes <= B) <-> HW pixels of B
// floats at `block` (lanes past `lanes` zero when blocking, skipped when unblocking), in
// groups of 8 lanes.
__attribute__((target("avx2"))) void blockPlanesAvx2(float* block, const float* const* planes, int64_t lanes, int64_t HW, int64_t B) {
    int64_t p = 0;
    for (; p + 8 <= HW; p += 8)
        for (int64_t l0 = 0; l0 < B; l0 += 8) {
            __m256 r[8];
            for (int64_t l = 0; l < 8; ++l) r[l] = l0 + l < lanes ? _mm256_loadu_ps(planes[l0 + l] + p) : _mm256_setzero_ps();
            transpose8x8(r);
            for (int64_t j = 0; j < 8; ++j) _mm256_storeu_ps(block + (p + j) * B + l0, r[j]);
        }
    for (; p < HW; ++p)
        for (int64_t l = 0; l < B; ++l) block[p * B + l] = l < lanes ? planes[l][p] : 0.f;
}

__attribute__((target("avx2"))) void unblockPlanesAvx2(float* const* planes, const float* block, int64_t lanes, int64_t HW, int64_t B) {
    int64_t p = 0;
    for (; p + 8 <= HW; p += 8)
        for (int64_t l0 = 0; l0 < lanes; l0 += 8) {
            __m256 r[8];
            for (int64_t j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(block + (p + j) * B + l0);
            transpose8x8(r);
            for (int64_t l = 0; l < 8 && l0 + l < lanes; ++l) _mm256_storeu_ps(planes[l0 + l] + p, r[l]);
        }
    for (; p < HW; ++p)
        for (int64_t l = 0; l < lanes; ++l) planes[l][p] = block[p * B + l];
}

std::vector<Tensor> fastBlockChannels(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t B = ctx.attrs().getInt("block", kChannelBlock);
    if (x.dtype() != DType::F32 || x.rank() != 4 || !isChannelBlock(B) || !cpuHasAvx2Fma()) return referenceFallback(ctx);
    const int64_t N = x.dims()[0], C = x.dims()[1], HW = x.dims()[2] * x.dims()[3], CB = channelBlocks(C, B);
    Tensor y = ctx.output(0, DType::F32, {N, CB, x.dims()[2], x.dims()[3], B});
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallelFor(N * CB, x.numel() > 16384, [&](int64_t q) {
        const int64_t n = q / CB, cb = q % CB;
        const float* planes[kWideChannelBlock];
        const int64_t lanes = std::min(B, C - cb * B);
        for (int64_t l = 0; l < lanes; ++l) planes[l] = px + (n * C + cb * B + l) * HW;
        blockPlanesAvx2(py + q * HW * B, planes, lanes, HW, B);
    });
    return {y};
}

std::vector<Tensor> fastUnblockChannels(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t C = ctx.attrs().getInt("channels", 0);
    if (x.dtype() != DType::F32 || x.rank() != 5 || !isChannelBlock(x.dims()[4]) || C <= 0 || channelBlocks(C, x.dims()[4]) != x.dims()[1] ||
        !cpuHasAvx2Fma())
        return referenceFallback(ctx);
    const int64_t N = x.dims()[0], CB = x.dims()[1], HW = x.dims()[2] * x.dims()[3], B = x.dims()[4];
    Tensor y = ctx.output(0, DType::F32, {N, C, x.dims()[2], x.dims()[3]});
    const float* px = x.data<float>();
    float* py = y.data<float>();
    parallelFor(N * CB, x.numel() > 16384, [&](int64_t q) {
        const int64_t n = q / CB, cb = q % CB;
        float* planes[kWideChannelBlock];
        const int64_t lanes = std::min(B, C - cb * B);
        for (int64_t l = 0; l < lanes; ++l) planes[l] = py + (n * C + cb * B + l) * HW;
        unblockPlanesAvx2(planes, px + q * HW * B, lanes, HW, B);
    });
    return {y};
}

// One plane of 16-lane pixels to 16 lanes with AVX-512: four pixels at a time into
// independent accumulators (one chain would wait on each add's latency).
__attribute__((target("avx512f"))) void globalPoolPlane16(const float* plane, float* out, int64_t HW, bool max) {
    if (max) {
        __m512 m[4];
        for (auto& v : m) v = _mm512_set1_ps(-INFINITY);
        int64_t p = 0;
        for (; p + 4 <= HW; p += 4)
            for (int u = 0; u < 4; ++u) m[u] = maxOrNan16(m[u], _mm512_loadu_ps(plane + (p + u) * 16));
        for (; p < HW; ++p) m[0] = maxOrNan16(m[0], _mm512_loadu_ps(plane + p * 16));
        _mm512_storeu_ps(out, maxOrNan16(maxOrNan16(m[0], m[1]), maxOrNan16(m[2], m[3])));
        return;
    }
    __m512d lo[4], hi[4];  // lanes 0-7 and 8-15 in double, as the reference sums
    for (int u = 0; u < 4; ++u) lo[u] = hi[u] = _mm512_setzero_pd();
    auto add = [](__m512d& l, __m512d& h, const float* px) __attribute__((target("avx512f"))) {
        l = _mm512_add_pd(l, _mm512_cvtps_pd(_mm256_loadu_ps(px)));
        h = _mm512_add_pd(h, _mm512_cvtps_pd(_mm256_loadu_ps(px + 8)));
    };
    int64_t p = 0;
    for (; p + 4 <= HW; p += 4)
        for (int u = 0; u < 4; ++u) add(lo[u], hi[u], plane + (p + u) * 16);
    for (; p < HW; ++p) add(lo[0], hi[0], plane + p * 16);
    const __m512d scale = _mm512_set1_pd(1.0 / static_cast<double>(std::max<int64_t>(HW, 1)));
    const __m512d l = _mm512_add_pd(_mm512_add_pd(lo[0], lo[1]), _mm512_add_pd(lo[2], lo[3]));
    const __m512d h = _mm512_add_pd(_mm512_add_pd(hi[0], hi[1]), _mm512_add_pd(hi[2], hi[3]));
    _mm256_storeu_ps(out, _mm512_cvtpd_ps(_mm512_mul_pd(l, scale)));
    _mm256_storeu_ps(out + 8, _mm512_cvtpd_ps(_mm512_mul_pd(h, scale)));
}

// Input (global) or output (windowed) floats past which a blocked pool is shared between
// threads. Below, one thread is faster: on the 2-core VM of 2026-12-03, small_cnn's batch-2
// MaxPool (8192 outputs) took 3 us alone and 9 us shared, its global average (16384 inputs)
// 1 us alone and 5 us shared (a region's futex calls, and the other core's half of the
// input to fetch); at batch 16 (8x larger) sharing won.
constexpr int64_t kGlobalPoolSharedFrom = 32768;
constexpr int64_t kPoolSharedFrom = 16384;
// Global pooling of blocked planes: each (image, block) plane of HW pixels to B lanes.
// Averages sum in double, as the reference does (planes can be large).
void globalPoolBlocked(const float* px, float* py, int64_t planes, int64_t HW, int64_t B, bool max) {
    const bool avx512 = B == 16 && cpuHasAvx512();
    parallelFor(planes, planes * HW * B > kGlobalPoolSharedFrom, [&](int64_t q) {
        if (avx512) {
            globalPoolPlane16(px + q * HW * B, py + q * B, HW, max);
            return;
        }
        const float* plane = px + q * HW * B;
        if (max) {
            float m[kWideChannelBlock];
            for (int64_t l = 0; l < B; ++l) m[l] = -INFINITY;
            for (int64_t p = 0; p < HW; ++p)
                for (int64_t l = 0; l < B; ++l) m[l] = maxOrNan(m[l], plane[p * B + l]);
            for (int64_t l = 0; l < B; ++l) py[q * B + l] = m[l];
        } else {
            double sum[kWideChannelBlock] = {};
            for (int64_t p = 0; p < HW; ++p)
#pragma omp simd
                for (int64_t l = 0; l < B; ++l) sum[l] += plane[p * B + l];
            for (int64_t l = 0; l < B; ++l) py[q * B + l] = static_cast<float>(sum[l] / static_cast<double>(std::max<int64_t>(HW, 1)));
        }
    });
}

// The windows of one output row of a blocked MaxPool / AveragePool.
struct PoolWindows {
    int64_t H, W, OW, KH, KW, sh, sw, dh, dw, pt, pl;
    bool max;
    int64_t B;  // channels per pixel
    bool include_pad = false;  // AveragePool's count_include_pad: the divisor counts taps in the padded image
    int64_t pb = 0, pr = 0;

    // An average's divisor: the taps inside the image (`inside`), or inside the padded image.
    float divisor(int64_t oh, int64_t ow, int64_t inside) const {
        if (!include_pad) return static_cast<float>(inside);
        auto taps = [](int64_t start, int64_t k, int64_t d, int64_t lo, int64_t hi) {
            int64_t n = 0;
            for (int64_t i = 0; i < k; ++i) n += start + i * d >= lo && start + i * d < hi;
            return n;
        };
        return static_cast<float>(taps(oh * sh - pt, KH, dh, -pt, H + pb) * taps(ow * sw - pl, KW, dw, -pl, W + pr));
    }

    template <typename Visit>
    int64_t window(int64_t oh, int64_t ow, Visit visit) const {  // visits the pixels inside; returns their count
        int64_t count = 0;
        for (int64_t i = 0; i < KH; ++i) {
            const int64_t h = oh * sh - pt + i * dh;
            if (h < 0 || h >= H) continue;
            for (int64_t j = 0; j < KW; ++j) {
                const int64_t w = ow * sw - pl + j * dw;
                if (w < 0 || w >= W) continue;
                visit((h * W + w) * B);
                ++count;
            }
        }
        return count;
    }
    void row(float* dst, const float* plane, int64_t oh) const {
        for (int64_t ow = 0; ow < OW; ++ow) {
            float acc[kWideChannelBlock];
            for (int64_t l = 0; l < B; ++l) acc[l] = max ? -INFINITY : 0.f;
            const int64_t count = window(oh, ow, [&](int64_t at) {
                for (int64_t l = 0; l < B; ++l) acc[l] = max ? maxOrNan(acc[l], plane[at + l]) : acc[l] + plane[at + l];
            });
            const float div = max ? 1.f : divisor(oh, ow, count);
            for (int64_t l = 0; l < B; ++l) dst[ow * B + l] = max ? acc[l] : (div > 0 ? acc[l] / div : 0.f);
        }
    }
    // The same with one vector per pixel and group of 8 lanes.
    __attribute__((target("avx2"))) void rowAvx2(float* dst, const float* plane, int64_t oh) const {
        for (int64_t l0 = 0; l0 < B; l0 += 8) rowLanesAvx2(dst + l0, plane + l0, oh);
    }
    // Blocks of 16 with one AVX-512 vector per pixel, four windows at a time where they lie
    // inside the plane: rowLanesAvx2 with 16-lane vectors (kept as a second copy because a
    // function's target attribute cannot follow a template parameter, and intrinsics do not
    // inline into a function compiled for a lesser target).
    __attribute__((target("avx512f"))) void rowAvx512(float* dst, const float* plane, int64_t oh) const {
        const int64_t h0 = oh * sh - pt;
        const bool rows_inside = h0 >= 0 && h0 + (KH - 1) * dh < H;
        const __m512 init = _mm512_set1_ps(max ? -INFINITY : 0.f);
        int64_t ow = 0;
        while (ow < OW) {
            const int64_t w0 = ow * sw - pl;
            if (rows_inside && ow + 4 <= OW && w0 >= 0 && (ow + 3) * sw - pl + (KW - 1) * dw < W) {
                __m512 acc[4] = {init, init, init, init};
                for (int64_t i = 0; i < KH; ++i)
                    for (int64_t j = 0; j < KW; ++j) {
                        const float* p = plane + ((h0 + i * dh) * W + w0 + j * dw) * 16;
                        for (int64_t u = 0; u < 4; ++u) {
                            const __m512 v = _mm512_loadu_ps(p + u * sw * 16);
                            acc[u] = max ? maxOrNan16(acc[u], v) : _mm512_add_ps(acc[u], v);
                        }
                    }
                const __m512 scale = _mm512_set1_ps(1.f / static_cast<float>(KH * KW));
                for (int64_t u = 0; u < 4; ++u) _mm512_storeu_ps(dst + (ow + u) * 16, max ? acc[u] : _mm512_mul_ps(acc[u], scale));
                ow += 4;
                continue;
            }
            __m512 acc = init;
            int64_t count = 0;
            for (int64_t i = 0; i < KH; ++i) {
                const int64_t h = h0 + i * dh;
                if (h < 0 || h >= H) continue;
                for (int64_t j = 0; j < KW; ++j) {
                    const int64_t w = w0 + j * dw;
                    if (w < 0 || w >= W) continue;
                    const __m512 v = _mm512_loadu_ps(plane + (h * W + w) * 16);
                    acc = max ? maxOrNan16(acc, v) : _mm512_add_ps(acc, v);
                    ++count;
                }
            }
            const float div = max ? 1.f : divisor(oh, ow, count);
            if (!max) acc = _mm512_mul_ps(acc, _mm512_set1_ps(div > 0 ? 1.f / div : 0.f));
            _mm512_storeu_ps(dst + ow * 16, acc);
            ++ow;
        }
    }
    // Lanes [l0, l0 + 8) of a row, dst and plane offset by l0 (no lambda: it would not inherit
    // the AVX2 target). Where four neighbouring windows lie inside the plane they go together,
    // four independent chains of max/add: one window's chain alone waits on each step's latency.
    __attribute__((target("avx2"))) void rowLanesAvx2(float* dst, const float* plane, int64_t oh) const {
        const int64_t h0 = oh * sh - pt;
        const bool rows_inside = h0 >= 0 && h0 + (KH - 1) * dh < H;
        int64_t ow = 0;
        while (ow < OW) {
            const int64_t w0 = ow * sw - pl;
            if (rows_inside && ow + 4 <= OW && w0 >= 0 && (ow + 3) * sw - pl + (KW - 1) * dw < W) {
                __m256 acc[4];
                for (auto& a : acc) a = _mm256_set1_ps(max ? -INFINITY : 0.f);
                for (int64_t i = 0; i < KH; ++i)
                    for (int64_t j = 0; j < KW; ++j) {
                        const float* p = plane + ((h0 + i * dh) * W + w0 + j * dw) * B;
                        for (int64_t u = 0; u < 4; ++u) {
                            const __m256 v = _mm256_loadu_ps(p + u * sw * B);
                            acc[u] = max ? maxOrNan8(acc[u], v) : _mm256_add_ps(acc[u], v);
                        }
                    }
                const __m256 scale = _mm256_set1_ps(1.f / static_cast<float>(KH * KW));
                for (int64_t u = 0; u < 4; ++u) _mm256_storeu_ps(dst + (ow + u) * B, max ? acc[u] : _mm256_mul_ps(acc[u], scale));
                ow += 4;
                continue;
            }
            __m256 acc = _mm256_set1_ps(max ? -INFINITY : 0.f);
            int64_t count = 0;
            for (int64_t i = 0; i < KH; ++i) {
                const int64_t h = h0 + i * dh;
                if (h < 0 || h >= H) continue;
                for (int64_t j = 0; j < KW; ++j) {
                    const int64_t w = w0 + j * dw;
                    if (w < 0 || w >= W) continue;
                    const __m256 v = _mm256_loadu_ps(plane + (h * W + w) * B);
                    acc = max ? maxOrNan8(acc, v) : _mm256_add_ps(acc, v);
                    ++count;
                }
            }
            const float div = max ? 1.f : divisor(oh, ow, count);
            if (!max) acc = _mm256_mul_ps(acc, _mm256_set1_ps(div > 0 ? 1.f / div : 0.f));
            _mm256_storeu_ps(dst + ow * B, acc);
            ++ow;
        }
    }
};

// BlockedPool (attribute "pool": MaxPool, AveragePool, GlobalAveragePool or GlobalMaxPool) on
// [N, C/B, H, W, B]: each window's pixels are B / 8 8-lane vectors.
std::vector<Tensor> fastBlockedPool(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Attributes& a = ctx.attrs();
    const std::string pool = a.getString("pool", "");
    if (x.dtype() != DType::F32 || x.rank() != 5 || !isChannelBlock(x.dims()[4]) || ctx.numOutputs() > 1) return referenceFallback(ctx);
    const int64_t N = x.dims()[0], CB = x.dims()[1], H = x.dims()[2], W = x.dims()[3], B = x.dims()[4];
    const float* px = x.data<float>();
    if (pool == "GlobalAveragePool" || pool == "GlobalMaxPool") {
        Tensor y = ctx.output(0, DType::F32, {N, CB, 1, 1, B});
        globalPoolBlocked(px, y.data<float>(), N * CB, H * W, B, pool == "GlobalMaxPool");
        return {y};
    }
    const bool max = pool == "MaxPool";
    const auto k = a.getInts("kernel_shape");
    const auto st = a.getInts("strides", {1, 1}), dil = a.getInts("dilations", {1, 1});
    if ((!max && pool != "AveragePool") || k.size() != 2 || st.size() != 2 || dil.size() != 2) return referenceFallback(ctx);
    const SpatialPads pads = resolvePads(ctx, {H, W}, k, st, dil);
    const Dims out = poolOutputSpatial(ctx, {H, W}, k, st, dil, pads);
    const int64_t OH = out[0], OW = out[1];
    Tensor y = ctx.output(0, DType::F32, {N, CB, OH, OW, B});
    float* py = y.data<float>();
    const PoolWindows win{H,   W, OW, k[0], k[1], st[0], st[1], dil[0], dil[1], pads.begin[0], pads.begin[1],
                          max, B, !max && a.getInt("count_include_pad", 0) != 0, pads.end[0], pads.end[1]};
    const bool avx2 = cpuHasAvx2Fma(), avx512 = B == 16 && cpuHasAvx512();
    parallelFor(N * CB * OH, N * CB * OH * OW * B > kPoolSharedFrom, [&](int64_t r) {
        const int64_t q = r / OH, oh = r % OH;
        const float* plane = px + q * H * W * B;
        float* row = py + r * OW * B;
        if (avx512) win.rowAvx512(row, plane, oh);
        else if (avx2) win.rowAvx2(row, plane, oh);
        else win.row(row, plane, oh);
    });
    return {y};
}

}  // namespace

void addChannelBlockTactics(std::vector<Tactic>& t) {
    t.push_back({"fast", "data", {"BlockChannels"}, supportsAnyNode, fastBlockChannels});
    t.push_back({"fast", "data", {"UnblockChannels"}, supportsAnyNode, fastUnblockChannels});
    t.push_back({"fast", "pool", {"BlockedPool"}, supportsAnyNode, fastBlockedPool});
}

}  // namespace kiln
