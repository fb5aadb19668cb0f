// Elementwise math, comparison and logic ops with numpy broadcasting.
#include <cmath>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

template <double (*F)(double)>
std::vector<Tensor> unaryFloat(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return mapElements<T>(x, [](double v) { return F(v); });
    })};
}

double reciprocal(double v) { return 1.0 / v; }
double roundHalfEven(double v) { return std::nearbyint(v); }  // default rounding mode is to-nearest-even

std::vector<Tensor> absKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            if constexpr (std::is_unsigned_v<T>) po[i] = px[i];
            else po[i] = static_cast<double>(px[i]) < 0 ? static_cast<T>(-static_cast<double>(px[i])) : px[i];
        }
        return out;
    })};
}

std::vector<Tensor> negKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor out(x.dtype(), x.dims());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            if constexpr (std::is_integral_v<T>) po[i] = static_cast<T>(-px[i]);
            else po[i] = static_cast<T>(-static_cast<double>(px[i]));
        }
        return out;
    })};
}

std::vector<Tensor> signKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    return {dispatchNumeric(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return mapElements<T>(x, [](double v) { return static_cast<double>((v > 0) - (v < 0)); });
    })};
}

template <bool (*F)(double)>
std::vector<Tensor> floatPredicate(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    Tensor out(DType::Bool, x.dims());
    bool* po = out.data<bool>();
    dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* px = x.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) po[i] = F(static_cast<double>(px[i]));
    });
    return {out};
}
bool isNan(double v) { return std::isnan(v); }

std::vector<Tensor> isInfKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    const bool neg = ctx.attrs().getInt("detect_negative", 1) != 0;
    const bool pos = ctx.attrs().getInt("detect_positive", 1) != 0;
    Tensor out(DType::Bool, x.dims());
    bool* po = out.data<bool>();
    dispatchFloat(x.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* px = x.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            double v = static_cast<double>(px[i]);
            po[i] = std::isinf(v) && ((v > 0 && pos) || (v < 0 && neg));
        }
    });
    return {out};
}

std::vector<Tensor> notKernel(const KernelContext& ctx) {
    const Tensor& x = ctx.input(0);
    ctx.require(x.dtype() == DType::Bool, "expects a bool tensor");
    Tensor out(DType::Bool, x.dims());
    for (int64_t i = 0; i < x.numel(); ++i) out.data<bool>()[i] = !x.data<bool>()[i];
    return {out};
}

enum class Arith { Add, Sub, Mul, Div };

template <Arith Op>
std::vector<Tensor> arithmetic(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    ctx.require(a.dtype() == b.dtype(), [&] { return "inputs have different element types " + a.summary() + " and " + b.summary(); });
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return broadcastBinary<T, T, T>(a, b, ctx, [&](T x, T y) -> T {
            if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {  // bool is refused at run time
                // Two's-complement wrap-around, as numpy and ONNX Runtime give: the sums and
                // products in unsigned arithmetic (signed overflow is undefined in C++), and
                // MIN / -1 as -MIN (the CPU's division instruction traps on it).
                using U = std::make_unsigned_t<T>;
                if constexpr (Op == Arith::Add) return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
                if constexpr (Op == Arith::Sub) return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
                if constexpr (Op == Arith::Mul) return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
                if constexpr (Op == Arith::Div) {
                    if (y == 0) ctx.fail("integer division by zero");
                    if constexpr (std::is_signed_v<T>)
                        if (y == -1) return static_cast<T>(U(0) - static_cast<U>(x));
                    return static_cast<T>(x / y);
                }
            } else {
                float fx = static_cast<float>(x), fy = static_cast<float>(y);
                if constexpr (std::is_same_v<T, double>) {
                    if constexpr (Op == Arith::Add) return x + y;
                    if constexpr (Op == Arith::Sub) return x - y;
                    if constexpr (Op == Arith::Mul) return x * y;
                    if constexpr (Op == Arith::Div) return x / y;
                }
                if constexpr (Op == Arith::Add) return static_cast<T>(fx + fy);
                if constexpr (Op == Arith::Sub) return static_cast<T>(fx - fy);
                if constexpr (Op == Arith::Mul) return static_cast<T>(fx * fy);
                if constexpr (Op == Arith::Div) return static_cast<T>(fx / fy);
            }
        });
    })};
}

std::vector<Tensor> powKernel(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto ta) {
        using T = typename decltype(ta)::type;
        return dispatchNumeric(b.dtype(), ctx.node.describe(), [&](auto tb) {
            using E = typename decltype(tb)::type;
            return broadcastBinary<T, T, E>(a, b, ctx, [](T x, E y) {
                return static_cast<T>(std::pow(static_cast<double>(x), static_cast<double>(y)));
            });
        });
    })};
}

std::vector<Tensor> modKernel(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const bool fmod = ctx.attrs().getInt("fmod", 0) != 0;
    ctx.require(fmod || !isFloating(a.dtype()), "fmod must be 1 for floating-point inputs");
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return broadcastBinary<T, T, T>(a, b, ctx, [&](T x, T y) -> T {
            if constexpr (std::is_integral_v<T>) {
                if (y == 0) ctx.fail("integer modulo by zero");
                if constexpr (std::is_signed_v<T>)
                    if (y == -1) return T(0);  // MIN % -1 traps like MIN / -1
                T r = static_cast<T>(x % y);
                if constexpr (std::is_signed_v<T>)
                    if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);  // sign of divisor
                return r;
            } else {
                return static_cast<T>(std::fmod(static_cast<double>(x), static_cast<double>(y)));
            }
        });
    })};
}

std::vector<Tensor> bitShiftKernel(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const bool left = ctx.attrs().getString("direction", "") == "LEFT";
    ctx.require(isUnsignedInteger(a.dtype()), "expects unsigned integer inputs");
    return {dispatchNumeric(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return broadcastBinary<T, T, T>(a, b, ctx, [&](T x, T y) -> T {
            if constexpr (std::is_integral_v<T>) {
                if (static_cast<uint64_t>(y) >= sizeof(T) * 8) return 0;
                return static_cast<T>(left ? x << y : x >> y);
            } else {
                return x;
            }
        });
    })};
}

enum class Cmp { Equal, Less, Greater, LessEq, GreaterEq };

template <Cmp Op>
std::vector<Tensor> compare(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    ctx.require(a.dtype() == b.dtype(), [&] { return "inputs have different element types " + a.summary() + " and " + b.summary(); });
    return {dispatchDType(a.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return broadcastBinary<bool, T, T>(a, b, ctx, [](T x, T y) {
            auto dx = static_cast<double>(x);
            auto dy = static_cast<double>(y);
            if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
                if constexpr (Op == Cmp::Equal) return x == y;
                if constexpr (Op == Cmp::Less) return x < y;
                if constexpr (Op == Cmp::Greater) return x > y;
                if constexpr (Op == Cmp::LessEq) return x <= y;
                if constexpr (Op == Cmp::GreaterEq) return x >= y;
            }
            if constexpr (Op == Cmp::Equal) return dx == dy;
            if constexpr (Op == Cmp::Less) return dx < dy;
            if constexpr (Op == Cmp::Greater) return dx > dy;
            if constexpr (Op == Cmp::LessEq) return dx <= dy;
            if constexpr (Op == Cmp::GreaterEq) return dx >= dy;
        });
    })};
}

enum class Logic { And, Or, Xor };

template <Logic Op>
std::vector<Tensor> logical(const KernelContext& ctx) {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    ctx.require(a.dtype() == DType::Bool && b.dtype() == DType::Bool, "expects bool inputs");
    return {broadcastBinary<bool, bool, bool>(a, b, ctx, [](bool x, bool y) {
        if constexpr (Op == Logic::And) return x && y;
        if constexpr (Op == Logic::Or) return x || y;
        return x != y;
    })};
}

std::vector<Tensor> whereKernel(const KernelContext& ctx) {
    const Tensor& c = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& y = ctx.input(2);
    ctx.require(c.dtype() == DType::Bool, "condition must be bool");
    ctx.require(x.dtype() == y.dtype(), "X and Y have different element types");
    Dims out_dims = broadcastDims(broadcastDims(c.dims(), x.dims(), [&] { return ctx.node.describe(); }), y.dims(), [&] { return ctx.node.describe(); });
    Tensor out(x.dtype(), out_dims);
    const BroadcastRuns runs(out_dims, {c.dims(), x.dims(), y.dims()});
    const int64_t len = runs.length(), sc = runs.step(0), sx = runs.step(1), sy = runs.step(2);
    const bool* pc = c.data<bool>();
    // Elements move as unsigned integers of their size (any dtype, no conversions).
    auto select = [&](auto word) {
        using W = decltype(word);
        const W* px = reinterpret_cast<const W*>(x.raw());
        const W* py = reinterpret_cast<const W*>(y.raw());
        W* po = reinterpret_cast<W*>(out.raw());
        runs.forEach([&](int64_t o, const int64_t* in) {
            for (int64_t j = 0; j < len; ++j) po[o + j] = pc[in[0] + j * sc] ? px[in[1] + j * sx] : py[in[2] + j * sy];
        });
    };
    switch (dtypeSize(x.dtype())) {
        case 1: select(uint8_t{}); break;
        case 2: select(uint16_t{}); break;
        case 4: select(uint32_t{}); break;
        case 8: select(uint64_t{}); break;
        default: ctx.require(false, "unsupported element type for Where");
    }
    return {out};
}

enum class Fold { Max, Min, Sum, Mean };

template <Fold Op>
std::vector<Tensor> variadic(const KernelContext& ctx) {
    ctx.require(ctx.numInputs() >= 1, "needs at least one input");
    const Tensor& first = ctx.input(0);
    return {dispatchNumeric(first.dtype(), ctx.node.describe(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor acc = first.clone();
        for (size_t i = 1; i < ctx.numInputs(); ++i) {
            const Tensor& next = ctx.input(i);
            ctx.require(next.dtype() == first.dtype(), "inputs have different element types");
            acc = broadcastBinary<T, T, T>(acc, next, ctx, [](T x, T y) -> T {
                if constexpr (std::is_integral_v<T>) {
                    if constexpr (Op == Fold::Max) return std::max(x, y);
                    if constexpr (Op == Fold::Min) return std::min(x, y);
                    return static_cast<T>(x + y);
                } else {
                    double dx = static_cast<double>(x), dy = static_cast<double>(y);
                    if (std::isnan(dx) || std::isnan(dy)) return static_cast<T>(std::numeric_limits<double>::quiet_NaN());
                    if constexpr (Op == Fold::Max) return static_cast<T>(std::max(dx, dy));
                    if constexpr (Op == Fold::Min) return static_cast<T>(std::min(dx, dy));
                    return static_cast<T>(dx + dy);
                }
            });
        }
        if constexpr (Op == Fold::Mean) {
            const double n = static_cast<double>(ctx.numInputs());
            acc = mapElements<T>(acc, [n](double v) { return v / n; });
        }
        return acc;
    })};
}

}  // namespace

void registerElementwiseKernels(KernelRegistry& r) {
    r.add("Sqrt", unaryFloat<std::sqrt>);
    r.add("Exp", unaryFloat<std::exp>);
    r.add("Log", unaryFloat<std::log>);
    r.add("Reciprocal", unaryFloat<reciprocal>);
    r.add("Floor", unaryFloat<std::floor>);
    r.add("Ceil", unaryFloat<std::ceil>);
    r.add("Round", unaryFloat<roundHalfEven>);
    r.add("Sin", unaryFloat<std::sin>);
    r.add("Cos", unaryFloat<std::cos>);
    r.add("Tan", unaryFloat<std::tan>);
    r.add("Asin", unaryFloat<std::asin>);
    r.add("Acos", unaryFloat<std::acos>);
    r.add("Atan", unaryFloat<std::atan>);
    r.add("Sinh", unaryFloat<std::sinh>);
    r.add("Cosh", unaryFloat<std::cosh>);
    r.add("Asinh", unaryFloat<std::asinh>);
    r.add("Acosh", unaryFloat<std::acosh>);
    r.add("Atanh", unaryFloat<std::atanh>);
    r.add("Erf", unaryFloat<std::erf>);
    r.add("Abs", absKernel);
    r.add("Neg", negKernel);
    r.add("Sign", signKernel);
    r.add("IsNaN", floatPredicate<isNan>);
    r.add("IsInf", isInfKernel);
    r.add("Not", notKernel);
    r.add("Add", arithmetic<Arith::Add>);
    r.add("Sub", arithmetic<Arith::Sub>);
    r.add("Mul", arithmetic<Arith::Mul>);
    r.add("Div", arithmetic<Arith::Div>);
    r.add("Pow", powKernel);
    r.add("Mod", modKernel);
    r.add("BitShift", bitShiftKernel);
    r.add("Equal", compare<Cmp::Equal>);
    r.add("Less", compare<Cmp::Less>);
    r.add("Greater", compare<Cmp::Greater>);
    r.add("LessOrEqual", compare<Cmp::LessEq>);
    r.add("GreaterOrEqual", compare<Cmp::GreaterEq>);
    r.add("And", logical<Logic::And>);
    r.add("Or", logical<Logic::Or>);
    r.add("Xor", logical<Logic::Xor>);
    r.add("Where", whereKernel);
    r.add("Max", variadic<Fold::Max>);
    r.add("Min", variadic<Fold::Min>);
    r.add("Sum", variadic<Fold::Sum>);
    r.add("Mean", variadic<Fold::Mean>);
}

}  // namespace kiln
