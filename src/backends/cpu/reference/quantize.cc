// Quantization ops as the ONNX spec defines them: QuantizeLinear, DequantizeLinear and
// DynamicQuantizeLinear (per tensor, per axis and, from opset 21, per block), and the
// integer products MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv. The integer
// products subtract the zero points into f64 operands and run the reference MatMul and Conv,
// which sum in f64: exact for every int8/uint8 product sum below 2^53.
#include <cmath>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

bool isQuantizedType(DType t) { return t == DType::I8 || t == DType::U8 || t == DType::I16 || t == DType::U16 || t == DType::I32; }

// Where each element of x finds its scale and zero point: one for the tensor, one per index
// of `axis`, or (opset 21) one per block of `block` indices along `axis`.
struct QuantParams {
    int64_t inner = 1, axis_dim = 1, block = 0, blocks = 1;
    bool per_tensor = true;

    int64_t index(int64_t i) const {
        if (per_tensor) return 0;
        const int64_t a = (i / inner) % axis_dim;
        if (block == 0) return a;
        const int64_t outer = i / (inner * axis_dim);
        return (outer * blocks + a / block) * inner + i % inner;
    }
};

QuantParams quantParams(const KernelContext& ctx, const Tensor& x, const Tensor& scale, const Tensor* zp) {
    QuantParams q;
    // Exporters pair a [1] scale with a scalar zero point (ONNX Runtime's quantizer does).
    if (zp) ctx.require(zp->dims() == scale.dims() || (zp->numel() == 1 && scale.numel() == 1),
                        [&] { return "zero point " + zp->summary() + " and scale " + scale.summary() + " differ in shape"; });
    const int64_t block = ctx.attrs().getInt("block_size", 0);
    if (scale.numel() == 1 && block == 0) return q;
    q.per_tensor = false;
    const int64_t axis = normalizeAxis(ctx.attrs().getInt("axis", 1), static_cast<int64_t>(x.rank()), ctx);
    q.axis_dim = x.dims()[axis];
    for (size_t d = static_cast<size_t>(axis) + 1; d < x.rank(); ++d) q.inner *= x.dims()[d];
    if (block > 0) {
        q.block = block;
        q.blocks = (q.axis_dim + block - 1) / block;
        Dims want = x.dims();
        want[axis] = q.blocks;
        ctx.require(scale.dims() == want, [&] { return "blocked scale must have shape " + dimsToString(want) + ", got " + scale.summary(); });
    } else {
        ctx.require(scale.rank() == 1 && scale.numel() == q.axis_dim,
                    [&] { return "scale " + scale.summary() + " is neither a scalar nor one value per index of axis " + std::to_string(axis); });
    }
    return q;
}

template <typename T>
double saturated(double v) {
    return std::min(std::max(v, static_cast<double>(std::numeric_limits<T>::lowest())), static_cast<double>(std::numeric_limits<T>::max()));
}

// A tensor of 8- or 16-bit integer type `t` whose element i is value(i) saturated to the
// type; value(i) is already rounded (std::nearbyint: half to even in the default rounding
// mode, as the Round kernel relies on too) and shifted by the zero point.
template <typename F>
Tensor quantizedTensor(DType t, const Dims& dims, F value, const KernelContext& ctx) {
    ctx.require(isQuantizedType(t) && t != DType::I32, [&] { return "output type " + std::string(dtypeName(t)) + " is not supported"; });
    Tensor y(t, dims);
    dispatchNumeric(t, ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<T>) {
            T* py = y.data<T>();
            for (int64_t i = 0; i < y.numel(); ++i) py[i] = static_cast<T>(saturated<T>(value(i)));
        }
    });
    return y;
}

std::vector<Tensor> quantizeLinear(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor* zp = ctx.optionalInput(2);
    DType out_type = zp ? zp->dtype() : DType::U8;
    if (!zp && ctx.attrs().has("output_dtype")) out_type = parseDType(ctx.attrs().getString("output_dtype", "u8"));
    const QuantParams q = quantParams(ctx, x, scale, zp);
    auto value = [&](int64_t i) {
        const int64_t p = q.index(i);
        // The division in the scale's precision, as the spec's reference computes it.
        const float v = static_cast<float>(x.scalarAt(i)) / static_cast<float>(scale.scalarAt(p));
        return std::nearbyint(v) + (zp ? zp->scalarAt(p) : 0.0);
    };
    return {quantizedTensor(out_type, x.dims(), value, ctx)};
}

std::vector<Tensor> dequantizeLinear(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor* zp = ctx.optionalInput(2);
    ctx.require(isQuantizedType(x.dtype()), [&] { return "input type " + std::string(dtypeName(x.dtype())) + " is not supported"; });
    if (zp) ctx.require(zp->dtype() == x.dtype(), [&] { return "zero point " + zp->summary() + " differs in type from the input " + x.summary(); });
    const QuantParams q = quantParams(ctx, x, scale, zp);
    Tensor y(scale.dtype(), x.dims());
    dispatchFloat(scale.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* py = y.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            const int64_t p = q.index(i);
            const float v = static_cast<float>(x.scalarAt(i) - (zp ? zp->scalarAt(p) : 0.0)) * static_cast<float>(scale.scalarAt(p));
            py[i] = static_cast<T>(v);
        }
    });
    return {y};
}

// y, y_scale, y_zero_point with the range of x (widened to include 0) mapped onto uint8.
std::vector<Tensor> dynamicQuantizeLinear(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.dtype() == DType::F32, [&] { return "input must be f32, got " + x.summary(); });
    const float* px = x.data<float>();
    float lo = 0.f, hi = 0.f;
    for (int64_t i = 0; i < x.numel(); ++i) lo = std::min(lo, px[i]), hi = std::max(hi, px[i]);
    const float scale = (hi - lo) / 255.f;
    // All zeros: any scale represents them; 0 keeps the division finite.
    const double zp = scale == 0.f ? 0.0 : saturated<uint8_t>(std::nearbyint(0.f - lo / scale));
    Tensor y = quantizedTensor(DType::U8, x.dims(), [&](int64_t i) { return scale == 0.f ? zp : std::nearbyint(px[i] / scale) + zp; }, ctx);
    return {y, Tensor::scalar<float>(scale), Tensor::scalar<uint8_t>(static_cast<uint8_t>(zp))};
}

// x - zero_point in f64; the zero point broadcasts against x after `zp_dims` reshapes it
// (a per-row [M] becomes [M, 1]).
Tensor minusZeroPoint(const Tensor& x, const Tensor* zp, const Dims& zp_dims, const KernelContext& ctx) {
    ctx.require(isQuantizedType(x.dtype()) && x.dtype() != DType::I32, [&] { return "operand " + x.summary() + " must be 8- or 16-bit integers"; });
    Tensor out(DType::F64, x.dims());
    double* po = out.data<double>();
    if (!zp) {
        for (int64_t i = 0; i < x.numel(); ++i) po[i] = x.scalarAt(i);
        return out;
    }
    ctx.require(zp->dtype() == x.dtype(), [&] { return "zero point " + zp->summary() + " differs in type from " + x.summary(); });
    const Tensor z = zp->reshaped(zp_dims);
    const Dims b = broadcastDims(x.dims(), z.dims(), [&] { return ctx.node.describe(); });
    ctx.require(b == x.dims(), [&] { return "zero point " + zp->summary() + " does not broadcast to " + x.summary(); });
    const auto off = broadcastOffsets(x.dims(), z.dims());
    for (int64_t i = 0; i < x.numel(); ++i) po[i] = x.scalarAt(i) - z.scalarAt(off[i]);
    return out;
}

// The per-row (A) or per-column (B) shape a 1-D zero point or scale of a matmul operand
// stands for; scalars and full-rank values keep theirs.
Dims matmulParamDims(const Tensor& p, bool row) {
    if (p.numel() == 1) return {};
    if (p.rank() != 1) return p.dims();
    return row ? Dims{p.numel(), 1} : Dims{p.numel()};
}

std::vector<Tensor> productInF64(const KernelContext& ctx, const Tensor& a, const Tensor& b, bool conv) {
    KernelContext inner{ctx.node, {&a, &b}, ctx.opset, {}, nullptr, nullptr};
    return conv ? convKernel(inner) : matmulKernel(inner);
}

Tensor toInt32(const Tensor& acc) {
    Tensor out(DType::I32, acc.dims());
    const double* p = acc.data<double>();
    for (int64_t i = 0; i < acc.numel(); ++i) out.data<int32_t>()[i] = static_cast<int32_t>(std::llround(p[i]));
    return out;
}

std::vector<Tensor> matMulInteger(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const Tensor* azp = ctx.optionalInput(2);
    const Tensor* bzp = ctx.optionalInput(3);
    const Tensor a64 = minusZeroPoint(a, azp, azp ? matmulParamDims(*azp, true) : Dims{}, ctx);
    const Tensor b64 = minusZeroPoint(b, bzp, bzp ? matmulParamDims(*bzp, false) : Dims{}, ctx);
    return {toInt32(productInF64(ctx, a64, b64, false)[0])};
}

// A conv weight's zero point: one for the tensor or one per output channel.
Dims convWeightParamDims(const Tensor& p, const Tensor& w) {
    if (p.numel() == 1) return {};
    Dims d(w.rank(), 1);
    d[0] = p.numel();
    return d;
}

std::vector<Tensor> convInteger(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* xzp = ctx.optionalInput(2);
    const Tensor* wzp = ctx.optionalInput(3);
    if (xzp) ctx.require(xzp->numel() == 1, "x_zero_point must be a scalar");
    const Tensor x64 = minusZeroPoint(x, xzp, {}, ctx);
    const Tensor w64 = minusZeroPoint(w, wzp, wzp ? convWeightParamDims(*wzp, w) : Dims{}, ctx);
    return {toInt32(productInF64(ctx, x64, w64, true)[0])};
}

// Requantizes an f64 product sum: y = round(acc * scale(i) / y_scale) + y_zp.
template <typename ScaleAt>
Tensor requantize(const KernelContext& ctx, const Tensor& acc, ScaleAt scale_at, const Tensor& y_scale, const Tensor* y_zp, DType out_type) {
    ctx.require(y_scale.numel() == 1 && (!y_zp || y_zp->numel() == 1), "y_scale and y_zero_point must be scalars");
    const double ys = y_scale.scalarAt(0), z = y_zp ? y_zp->scalarAt(0) : 0.0;
    const double* p = acc.data<double>();
    return quantizedTensor(out_type, acc.dims(), [&](int64_t i) { return std::nearbyint(p[i] * scale_at(i) / ys) + z; }, ctx);
}

std::vector<Tensor> qlinearMatMul(const KernelContext& ctx) {
    const Tensor &a = ctx.input(0), &as = ctx.input(1), &azp = ctx.input(2);
    const Tensor &b = ctx.input(3), &bs = ctx.input(4), &bzp = ctx.input(5);
    const Tensor &ys = ctx.input(6), &yzp = ctx.input(7);
    const Tensor a64 = minusZeroPoint(a, &azp, matmulParamDims(azp, true), ctx);
    const Tensor b64 = minusZeroPoint(b, &bzp, matmulParamDims(bzp, false), ctx);
    const Tensor acc = productInF64(ctx, a64, b64, false)[0];
    const int64_t N = b.rank() == 1 ? 1 : b.dims().back(), M = a.rank() == 1 ? 1 : a.dims()[a.rank() - 2];
    ctx.require(as.numel() == 1 || as.numel() == M, "a_scale must be a scalar or one value per row of A");
    ctx.require(bs.numel() == 1 || bs.numel() == N, "b_scale must be a scalar or one value per column of B");
    auto scale_at = [&](int64_t i) {
        const int64_t j = i % N, r = (i / N) % M;
        return as.scalarAt(as.numel() == 1 ? 0 : r) * bs.scalarAt(bs.numel() == 1 ? 0 : j);
    };
    return {requantize(ctx, acc, scale_at, ys, &yzp, yzp.dtype())};
}

std::vector<Tensor> qlinearConv(const KernelContext& ctx) {
    const Tensor &x = ctx.input(0), &xs = ctx.input(1), &xzp = ctx.input(2);
    const Tensor &w = ctx.input(3), &ws = ctx.input(4), &wzp = ctx.input(5);
    const Tensor& ys = ctx.input(6);
    const Tensor* yzp = ctx.optionalInput(7);
    const Tensor* bias = ctx.optionalInput(8);
    ctx.require(xs.numel() == 1 && xzp.numel() == 1, "x_scale and x_zero_point must be scalars");
    const int64_t M = w.dims()[0];
    ctx.require(ws.numel() == 1 || ws.numel() == M, "w_scale must be a scalar or one value per output channel");
    const Tensor x64 = minusZeroPoint(x, &xzp, {}, ctx);
    const Tensor w64 = minusZeroPoint(w, &wzp, convWeightParamDims(wzp, w), ctx);
    Tensor acc = productInF64(ctx, x64, w64, true)[0];
    const int64_t spatial = acc.numel() / (acc.dims()[0] * M);
    if (bias) {
        ctx.require(bias->dtype() == DType::I32 && bias->numel() == M, "bias must be int32 with one value per output channel");
        double* p = acc.data<double>();
        for (int64_t i = 0; i < acc.numel(); ++i) p[i] += bias->scalarAt((i / spatial) % M);
    }
    auto scale_at = [&](int64_t i) { return xs.scalarAt(0) * ws.scalarAt(ws.numel() == 1 ? 0 : (i / spatial) % M); };
    return {requantize(ctx, acc, scale_at, ys, yzp, yzp ? yzp->dtype() : x.dtype())};
}

// kiln's channels-last QLinearConv (passes/quantized_layout.cc): x and y in NHWC.
std::vector<Tensor> qlinearConvNhwc(const KernelContext& ctx) {
    ctx.require(ctx.input(0).rank() == 4, "a channels-last QLinearConv needs a 4-D input");
    const Tensor x = transposeTensor(ctx.input(0), {0, 3, 1, 2});
    std::vector<const Tensor*> inputs = ctx.inputs;
    inputs[0] = &x;
    const Tensor y = qlinearConv(KernelContext{ctx.node, inputs, ctx.opset, nullptr})[0];
    return {transposeTensor(y, {0, 2, 3, 1})};
}

// kiln's 8-bit table lookup (passes/quantized_lookup.cc): y[i] = table[x[i] - lowest code].
std::vector<Tensor> quantizedLookup(const KernelContext& ctx) {
    const Tensor &x = ctx.input(0), &table = ctx.input(1);
    ctx.require((x.dtype() == DType::U8 || x.dtype() == DType::I8) && table.numel() == 256 && dtypeSize(table.dtype()) == 1,
                [&] { return "a lookup takes 8-bit codes and a 256-entry table of 8-bit codes, got " + x.summary() + " and " + table.summary(); });
    Tensor y(table.dtype(), x.dims());
    const auto* t = reinterpret_cast<const uint8_t*>(table.raw());
    const auto* px = reinterpret_cast<const uint8_t*>(x.raw());
    auto* py = reinterpret_cast<uint8_t*>(y.raw());
    const uint8_t offset = x.dtype() == DType::I8 ? 128 : 0;  // int8 code c sits at c + 128
    for (int64_t i = 0; i < x.numel(); ++i) py[i] = t[static_cast<uint8_t>(px[i] + offset)];
    return {y};
}

}  // namespace

void registerQuantizeKernels(KernelRegistry& r) {
    r.add("QuantizeLinear", quantizeLinear);
    r.add("DequantizeLinear", dequantizeLinear);
    r.add("DynamicQuantizeLinear", dynamicQuantizeLinear);
    r.add("MatMulInteger", matMulInteger);
    r.add("ConvInteger", convInteger);
    r.add("QLinearMatMul", qlinearMatMul);
    r.add("QLinearConv", qlinearConv);
    r.add("QLinearConvNhwc", qlinearConvNhwc);
    r.add("QuantizedLookup", quantizedLookup);
}

}  // namespace kiln
