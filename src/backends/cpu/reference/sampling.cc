// Sampling at computed positions: GridSample (2-D; nearest, linear and cubic; zeros,
// border and reflection padding) and RoiAlign (average or max pooling of bilinear samples
// over each region of interest), following the ONNX spec and its reference implementation.
#include <cmath>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class Padding { Zeros, Border, Reflection };
enum class Interpolation { Nearest, Linear, Cubic };

// Folds x into [lo, hi] by reflecting at the borders as often as it takes.
double reflect(double x, double lo, double hi) {
    const double range = hi - lo;
    if (range <= 0) return lo;
    if (x < lo) {
        const double d = lo - x;
        const int64_t n = static_cast<int64_t>(d / range);
        const double r = d - static_cast<double>(n) * range;
        return n % 2 == 0 ? lo + r : hi - r;
    }
    if (x > hi) {
        const double d = x - hi;
        const int64_t n = static_cast<int64_t>(d / range);
        const double r = d - static_cast<double>(n) * range;
        return n % 2 == 0 ? hi - r : lo + r;
    }
    return x;
}

struct GridSampler {
    const double* image;  // one channel, [H, W]
    int64_t H, W;
    Padding padding;
    double x_lo, x_hi, y_lo, y_hi;  // the reflection borders

    double at(int64_t r, int64_t c) const {
        switch (padding) {
            case Padding::Zeros: return r >= 0 && r < H && c >= 0 && c < W ? image[r * W + c] : 0.0;
            case Padding::Border:
                r = std::clamp<int64_t>(r, 0, H - 1), c = std::clamp<int64_t>(c, 0, W - 1);
                return image[r * W + c];
            case Padding::Reflection:
                r = static_cast<int64_t>(reflect(static_cast<double>(r), y_lo, y_hi));
                c = static_cast<int64_t>(reflect(static_cast<double>(c), x_lo, x_hi));
                return image[std::clamp<int64_t>(r, 0, H - 1) * W + std::clamp<int64_t>(c, 0, W - 1)];
        }
        return 0.0;
    }
};

// Cubic convolution weights (A = -0.75) of the four taps around fraction t.
void cubicWeights(double t, double w[4]) {
    constexpr double A = -0.75;
    auto near = [](double d) { return ((A + 2) * d - (A + 3)) * d * d + 1; };
    auto far = [](double d) { return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A; };
    w[0] = far(t + 1), w[1] = near(t), w[2] = near(1 - t), w[3] = far(2 - t);
}

std::vector<Tensor> gridSample(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& grid = ctx.input(1);
    ctx.require(x.rank() == 4, [&] { return "only 2-D sampling (a rank-4 input) is supported, got " + x.summary(); });
    const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3];
    ctx.require(grid.rank() == 4 && grid.dims()[0] == N && grid.dims()[3] == 2, [&] { return "grid must be [N, H_out, W_out, 2], got " + grid.summary(); });
    const int64_t Ho = grid.dims()[1], Wo = grid.dims()[2];
    const std::string mode_name = ctx.attrs().getString("mode", ctx.opset >= 20 ? "linear" : "bilinear");
    Interpolation mode = Interpolation::Linear;  // "bilinear" and "bicubic" are opset 16's names
    if (mode_name == "nearest") mode = Interpolation::Nearest;
    else if (mode_name == "cubic" || mode_name == "bicubic") mode = Interpolation::Cubic;
    else ctx.require(mode_name == "linear" || mode_name == "bilinear", [&] { return "unknown mode '" + mode_name + "'"; });
    const std::string pad = ctx.attrs().getString("padding_mode", "zeros");
    ctx.require(pad == "zeros" || pad == "border" || pad == "reflection", [&] { return "unknown padding_mode '" + pad + "'"; });
    const Padding padding = pad == "zeros" ? Padding::Zeros : pad == "border" ? Padding::Border : Padding::Reflection;
    const bool align = ctx.attrs().getInt("align_corners", 0) != 0;
    // Pixel coordinates from [-1, 1]: corner pixels' centres, or their outer edges.
    auto denormalize = [&](double v, int64_t len) { return align ? (v + 1) / 2 * static_cast<double>(len - 1) : ((v + 1) * static_cast<double>(len) - 1) / 2; };
    const double x_lo = align ? 0.0 : -0.5, x_hi = align ? static_cast<double>(W - 1) : static_cast<double>(W) - 0.5;
    const double y_lo = align ? 0.0 : -0.5, y_hi = align ? static_cast<double>(H - 1) : static_cast<double>(H) - 0.5;

    std::vector<double> img(static_cast<size_t>(H * W));
    std::vector<double> out(static_cast<size_t>(N * C * Ho * Wo));
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
            for (int64_t i = 0; i < H * W; ++i) img[i] = x.scalarAt((n * C + c) * H * W + i);
            const GridSampler s{img.data(), H, W, padding, x_lo, x_hi, y_lo, y_hi};
            for (int64_t p = 0; p < Ho * Wo; ++p) {
                double gx = denormalize(grid.scalarAt((n * Ho * Wo + p) * 2), W);
                double gy = denormalize(grid.scalarAt((n * Ho * Wo + p) * 2 + 1), H);
                if (mode == Interpolation::Nearest) gx = std::nearbyint(gx), gy = std::nearbyint(gy);
                if (gx < x_lo || gx > x_hi || gy < y_lo || gy > y_hi) {
                    if (padding == Padding::Border) {
                        gx = std::clamp(gx, 0.0, static_cast<double>(W - 1)), gy = std::clamp(gy, 0.0, static_cast<double>(H - 1));
                    } else if (padding == Padding::Reflection) {
                        gx = reflect(gx, x_lo, x_hi), gy = reflect(gy, y_lo, y_hi);
                    }
                }
                double v = 0;
                if (mode == Interpolation::Nearest) {
                    v = s.at(static_cast<int64_t>(std::nearbyint(gy)), static_cast<int64_t>(std::nearbyint(gx)));
                } else if (mode == Interpolation::Linear) {
                    const double fx = std::floor(gx), fy = std::floor(gy), dx = gx - fx, dy = gy - fy;
                    const int64_t c0 = static_cast<int64_t>(fx), r0 = static_cast<int64_t>(fy);
                    v = (1 - dy) * ((1 - dx) * s.at(r0, c0) + dx * s.at(r0, c0 + 1)) + dy * ((1 - dx) * s.at(r0 + 1, c0) + dx * s.at(r0 + 1, c0 + 1));
                } else {
                    const double fx = std::floor(gx), fy = std::floor(gy);
                    double wx[4], wy[4];
                    cubicWeights(gx - fx, wx);
                    cubicWeights(gy - fy, wy);
                    const int64_t c0 = static_cast<int64_t>(fx) - 1, r0 = static_cast<int64_t>(fy) - 1;
                    for (int i = 0; i < 4; ++i) {
                        double row = 0;
                        for (int j = 0; j < 4; ++j) row += wx[j] * s.at(r0 + i, c0 + j);
                        v += wy[i] * row;
                    }
                }
                out[(n * C + c) * Ho * Wo + p] = v;
            }
        }
    return {tensorFromDoubles(x.dtype(), {N, C, Ho, Wo}, out, ctx)};
}

// RoiAlign: each region [x1, y1, x2, y2] (scaled by spatial_scale) split into
// output_height x output_width bins, each bin the average (or maximum) of a grid of bilinear
// samples (sampling_ratio per side, or as many as the bin is pixels wide).
std::vector<Tensor> roiAlign(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& rois = ctx.input(1);
    const Tensor& batch = ctx.input(2);
    ctx.require(x.rank() == 4, [&] { return "input must be [N, C, H, W], got " + x.summary(); });
    ctx.require(rois.rank() == 2 && rois.dims()[1] == 4, [&] { return "rois must be [num_rois, 4], got " + rois.summary(); });
    const int64_t R = rois.dims()[0];
    ctx.require(batch.numel() == R, [&] { return "batch_indices must have one entry per roi, got " + batch.summary(); });
    const int64_t N = x.dims()[0], C = x.dims()[1], H = x.dims()[2], W = x.dims()[3];
    const int64_t oh = ctx.attrs().getInt("output_height", 1), ow = ctx.attrs().getInt("output_width", 1);
    const int64_t ratio = ctx.attrs().getInt("sampling_ratio", 0);
    const double scale = ctx.attrs().getFloat("spatial_scale", 1.0f);
    const bool avg = ctx.attrs().getString("mode", "avg") == "avg";
    ctx.require(avg || ctx.attrs().getString("mode", "avg") == "max", [&] { return "unknown mode '" + ctx.attrs().getString("mode", "") + "'"; });
    const std::string ctm = ctx.attrs().getString("coordinate_transformation_mode", ctx.opset >= 16 ? "half_pixel" : "output_half_pixel");
    ctx.require(ctm == "half_pixel" || ctm == "output_half_pixel", [&] { return "unknown coordinate_transformation_mode '" + ctm + "'"; });
    const bool half_pixel = ctm == "half_pixel";
    ctx.require(oh > 0 && ow > 0, "output_height and output_width must be positive");
    std::vector<double> out(static_cast<size_t>(R * C * oh * ow));
    for (int64_t r = 0; r < R; ++r) {
        const int64_t n = static_cast<int64_t>(batch.scalarAt(r));
        ctx.require(n >= 0 && n < N, [&] { return "batch index " + std::to_string(n) + " of roi " + std::to_string(r) + " is outside [0, " + std::to_string(N) + ")"; });
        const double off = half_pixel ? 0.5 : 0.0;
        const double x0 = rois.scalarAt(r * 4) * scale - off, y0 = rois.scalarAt(r * 4 + 1) * scale - off;
        double rw = rois.scalarAt(r * 4 + 2) * scale - off - x0, rh = rois.scalarAt(r * 4 + 3) * scale - off - y0;
        if (!half_pixel) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
        const double bh = rh / static_cast<double>(oh), bw = rw / static_cast<double>(ow);
        const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / static_cast<double>(oh)));
        const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / static_cast<double>(ow)));
        const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
        for (int64_t c = 0; c < C; ++c) {
            const int64_t base = (n * C + c) * H * W;
            for (int64_t ph = 0; ph < oh; ++ph)
                for (int64_t pw = 0; pw < ow; ++pw) {
                    double acc = avg ? 0.0 : -INFINITY;
                    for (int64_t iy = 0; iy < gh; ++iy)
                        for (int64_t ix = 0; ix < gw; ++ix) {
                            double y = y0 + static_cast<double>(ph) * bh + (static_cast<double>(iy) + 0.5) * bh / static_cast<double>(gh);
                            double xx = x0 + static_cast<double>(pw) * bw + (static_cast<double>(ix) + 0.5) * bw / static_cast<double>(gw);
                            double w[4] = {0, 0, 0, 0}, v[4] = {0, 0, 0, 0};
                            if (!(y < -1.0 || y > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W))) {
                                y = std::max(y, 0.0), xx = std::max(xx, 0.0);
                                int64_t yl = static_cast<int64_t>(y), xl = static_cast<int64_t>(xx), yh, xh;
                                if (yl >= H - 1) yh = yl = H - 1, y = static_cast<double>(yl);
                                else yh = yl + 1;
                                if (xl >= W - 1) xh = xl = W - 1, xx = static_cast<double>(xl);
                                else xh = xl + 1;
                                const double ly = y - static_cast<double>(yl), lx = xx - static_cast<double>(xl);
                                w[0] = (1 - ly) * (1 - lx), w[1] = (1 - ly) * lx, w[2] = ly * (1 - lx), w[3] = ly * lx;
                                v[0] = x.scalarAt(base + yl * W + xl), v[1] = x.scalarAt(base + yl * W + xh);
                                v[2] = x.scalarAt(base + yh * W + xl), v[3] = x.scalarAt(base + yh * W + xh);
                            }
                            if (avg) {
                                acc += w[0] * v[0] + w[1] * v[1] + w[2] * v[2] + w[3] * v[3];
                            } else {  // the largest weighted corner, as ONNX Runtime's max mode takes it
                                for (int k = 0; k < 4; ++k) acc = std::max(acc, w[k] * v[k]);
                            }
                        }
                    out[((r * C + c) * oh + ph) * ow + pw] = avg ? acc / count : (gh * gw > 0 ? acc : 0.0);
                }
        }
    }
    return {tensorFromDoubles(x.dtype(), {R, C, oh, ow}, out, ctx)};
}

}  // namespace

void registerSamplingKernels(KernelRegistry& r) {
    r.add("GridSample", gridSample);
    r.add("RoiAlign", roiAlign);
}

}  // namespace kiln
