// Signal processing (opset 17): the Hann, Hamming and Blackman windows, DFT, STFT and
// MelWeightMatrix, as audio front-ends export them. Sums run in double over the direct
// O(n^2) transform: slow and exact enough to be the reference.
#include <cmath>
#include <numbers>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

DType outputDatatype(const KernelContext& ctx) { return parseDType(ctx.attrs().getString("output_datatype", "f32")); }

template <int kKind>  // 0 Hann, 1 Hamming, 2 Blackman
std::vector<Tensor> window(const KernelContext& ctx) {
    const int64_t n = static_cast<int64_t>(ctx.input(0).scalarAt(0));
    ctx.require(n >= 0, "size must not be negative");
    const bool periodic = ctx.attrs().getInt("periodic", 1) != 0;
    const double denom = static_cast<double>(periodic ? n : n - 1);
    std::vector<double> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        const double a = denom > 0 ? 2 * std::numbers::pi * static_cast<double>(i) / denom : 0.0;
        if constexpr (kKind == 0) w[i] = 0.5 - 0.5 * std::cos(a);
        else if constexpr (kKind == 1) w[i] = 25.0 / 46.0 - (1 - 25.0 / 46.0) * std::cos(a);
        else w[i] = 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);
    }
    return {tensorFromDoubles(outputDatatype(ctx), {n}, w, ctx)};
}

// A signal [..., length, 1 or 2] read as complex values along `axis`.
struct ComplexSignal {
    const Tensor& t;
    bool complex;
    int64_t outer, length, inner;  // [outer, length, inner, 1|2]

    ComplexSignal(const Tensor& x, int64_t axis, const KernelContext& ctx) : t(x) {
        ctx.require(x.rank() >= 2 && (x.dims().back() == 1 || x.dims().back() == 2), [&] { return "signal must end in a dimension of 1 (real) or 2 (complex), got " + x.summary(); });
        complex = x.dims().back() == 2;
        ctx.require(axis >= 0 && axis < static_cast<int64_t>(x.rank()) - 1, [&] { return "axis " + std::to_string(axis) + " is outside the signal's dimensions"; });
        outer = 1, inner = 1, length = x.dims()[axis];
        for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
        for (size_t d = static_cast<size_t>(axis) + 1; d + 1 < x.rank(); ++d) inner *= x.dims()[d];
    }
    double re(int64_t o, int64_t i, int64_t k) const { return t.scalarAt(((o * length + i) * inner + k) * (complex ? 2 : 1)); }
    double im(int64_t o, int64_t i, int64_t k) const { return complex ? t.scalarAt(((o * length + i) * inner + k) * 2 + 1) : 0.0; }
};

// X[f] = sum_j x[j] w[j] exp(-+2 pi i f j / n) for f < bins, over the first min(n, len) samples.
void transform(const std::vector<double>& re, const std::vector<double>& im, int64_t n, int64_t bins, bool inverse, double* out) {
    const int64_t m = std::min<int64_t>(n, static_cast<int64_t>(re.size()));
    const double sign = inverse ? 1.0 : -1.0;
    for (int64_t f = 0; f < bins; ++f) {
        double sr = 0, si = 0;
        for (int64_t j = 0; j < m; ++j) {
            const double a = sign * 2 * std::numbers::pi * static_cast<double>((f * j) % n) / static_cast<double>(n);
            sr += re[j] * std::cos(a) - im[j] * std::sin(a);
            si += re[j] * std::sin(a) + im[j] * std::cos(a);
        }
        out[2 * f] = inverse ? sr / static_cast<double>(n) : sr;
        out[2 * f + 1] = inverse ? si / static_cast<double>(n) : si;
    }
}

std::vector<Tensor> dft(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    int64_t axis = ctx.attrs().getInt("axis", 1);
    if (ctx.opset >= 20) axis = ctx.hasInput(2) ? static_cast<int64_t>(ctx.input(2).scalarAt(0)) : -2;
    if (axis < 0) axis += rank;  // opset 20 counts from the end over all dims, the last included
    const ComplexSignal s(x, axis, ctx);
    const int64_t n = ctx.hasInput(1) ? static_cast<int64_t>(ctx.input(1).scalarAt(0)) : s.length;
    ctx.require(n > 0, "dft_length must be positive");
    const bool inverse = ctx.attrs().getInt("inverse", 0) != 0, onesided = ctx.attrs().getInt("onesided", 0) != 0;
    ctx.require(!(inverse && onesided), "inverse and onesided cannot both be set");
    const int64_t bins = onesided ? n / 2 + 1 : n;
    Dims out_dims = x.dims();
    out_dims[axis] = bins;
    out_dims.back() = 2;
    std::vector<double> out(static_cast<size_t>(numElements(out_dims)));
    std::vector<double> re(static_cast<size_t>(s.length)), im(re.size()), col(static_cast<size_t>(2 * bins));
    for (int64_t o = 0; o < s.outer; ++o)
        for (int64_t k = 0; k < s.inner; ++k) {
            for (int64_t j = 0; j < s.length; ++j) re[j] = s.re(o, j, k), im[j] = s.im(o, j, k);
            transform(re, im, n, bins, inverse, col.data());
            for (int64_t f = 0; f < bins; ++f)
                for (int c = 0; c < 2; ++c) out[((o * bins + f) * s.inner + k) * 2 + c] = col[2 * f + c];
        }
    return {tensorFromDoubles(x.dtype(), out_dims, out, ctx)};
}

// STFT(signal [batch, length, 1|2], frame_step, window?, frame_length?) ->
// [batch, frames, bins, 2]: each frame, times the window, through a DFT of the frame's length.
std::vector<Tensor> stft(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() == 3, [&] { return "signal must be [batch, length, 1 or 2], got " + x.summary(); });
    const ComplexSignal s(x, 1, ctx);
    const int64_t step = static_cast<int64_t>(ctx.input(1).scalarAt(0));
    const Tensor* win = ctx.optionalInput(2);
    int64_t frame = ctx.hasInput(3) ? static_cast<int64_t>(ctx.input(3).scalarAt(0)) : (win ? win->numel() : 0);
    ctx.require(frame > 0, "needs a window or a frame_length");
    if (win) ctx.require(win->numel() == frame, [&] { return "window has " + std::to_string(win->numel()) + " values for frame_length " + std::to_string(frame); });
    ctx.require(step > 0 && frame <= s.length, "frame_step must be positive and frame_length at most the signal's length");
    const bool onesided = ctx.attrs().getInt("onesided", 1) != 0;
    const int64_t bins = onesided ? frame / 2 + 1 : frame, frames = (s.length - frame) / step + 1;
    std::vector<double> out(static_cast<size_t>(s.outer * frames * bins * 2));
    std::vector<double> re(static_cast<size_t>(frame)), im(re.size());
    for (int64_t b = 0; b < s.outer; ++b)
        for (int64_t f = 0; f < frames; ++f) {
            for (int64_t j = 0; j < frame; ++j) {
                const double w = win ? win->scalarAt(j) : 1.0;
                re[j] = s.re(b, f * step + j, 0) * w, im[j] = s.im(b, f * step + j, 0) * w;
            }
            transform(re, im, frame, bins, false, out.data() + (b * frames + f) * bins * 2);
        }
    return {tensorFromDoubles(x.dtype(), {s.outer, frames, bins, 2}, out, ctx)};
}

// Triangular filters evenly spaced on the mel scale, as [dft_length / 2 + 1, num_mel_bins].
std::vector<Tensor> melWeightMatrix(const KernelContext& ctx) {
    const int64_t mels = static_cast<int64_t>(ctx.input(0).scalarAt(0)), dft_length = static_cast<int64_t>(ctx.input(1).scalarAt(0));
    const double rate = ctx.input(2).scalarAt(0), lo = ctx.input(3).scalarAt(0), hi = ctx.input(4).scalarAt(0);
    ctx.require(mels > 0 && dft_length > 0 && rate > 0 && lo >= 0 && hi > lo, "needs positive bin counts and sample rate, and 0 <= lower edge < upper edge");
    const int64_t bins = dft_length / 2 + 1;
    auto toMel = [](double hz) { return 2595.0 * std::log10(1 + hz / 700.0); };
    // The spec divides the mel range by the number of edges (mels + 2), not the gaps.
    const double mlo = toMel(lo), step = (toMel(hi) - mlo) / static_cast<double>(mels + 2);
    std::vector<int64_t> edge(static_cast<size_t>(mels + 2));
    for (int64_t i = 0; i < mels + 2; ++i) {
        const double hz = 700.0 * (std::pow(10.0, (mlo + step * static_cast<double>(i)) / 2595.0) - 1);
        edge[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * hz / rate));
    }
    std::vector<double> w(static_cast<size_t>(bins * mels), 0.0);
    auto set = [&](int64_t j, int64_t i, double v) {
        if (j >= 0 && j < bins) w[j * mels + i] = v;
    };
    for (int64_t i = 0; i < mels; ++i) {
        const int64_t left = edge[i], centre = edge[i + 1], right = edge[i + 2];
        if (centre == left) set(centre, i, 1.0);
        else
            for (int64_t j = left; j <= centre; ++j) set(j, i, static_cast<double>(j - left) / static_cast<double>(centre - left));
        for (int64_t j = centre; j < right; ++j) set(j, i, static_cast<double>(right - j) / static_cast<double>(right - centre));
    }
    return {tensorFromDoubles(outputDatatype(ctx), {bins, mels}, w, ctx)};
}

}  // namespace

void registerSignalKernels(KernelRegistry& r) {
    r.add("HannWindow", window<0>);
    r.add("HammingWindow", window<1>);
    r.add("BlackmanWindow", window<2>);
    r.add("DFT", dft);
    r.add("STFT", stft);
    r.add("MelWeightMatrix", melWeightMatrix);
}

}  // namespace kiln
