#include "backends/cpu/fast/epilogue.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ir/error.h"

namespace kiln {

Activation Activation::fromNode(const Node& n) {
    static const std::pair<const char*, ActKind> names[] = {
        {"none", ActKind::None}, {"Relu", ActKind::Relu}, {"Clip", ActKind::Clip}, {"Sigmoid", ActKind::Sigmoid}, {"Silu", ActKind::Silu}, {"Tanh", ActKind::Tanh},
        {"LeakyRelu", ActKind::LeakyRelu}, {"HardSigmoid", ActKind::HardSigmoid}, {"HardSwish", ActKind::HardSwish}, {"Gelu", ActKind::Gelu},
        {"GeluTanh", ActKind::GeluTanh}, {"Softplus", ActKind::Softplus}, {"Erf", ActKind::Erf}, {"Exp", ActKind::Exp}, {"Log", ActKind::Log},
        {"Sqrt", ActKind::Sqrt}, {"Neg", ActKind::Neg}, {"Abs", ActKind::Abs}, {"Reciprocal", ActKind::Reciprocal}};
    Activation act;
    const std::string name = n.attrs.getString("activation", "none");
    bool found = false;
    for (const auto& [text, kind] : names)
        if (name == text) {
            act.kind = kind;
            found = true;
        }
    check(found, [&] { return n.describe() + ": unknown fused activation '" + name + "'"; });
    auto p = n.attrs.getFloats("activation_params");
    if (p.size() > 0) act.a = p[0];
    if (p.size() > 1) act.b = p[1];
    return act;
}

namespace {

// Hot loops, compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time.
#define KILN_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

KILN_CLONES void addRow(float* y, int64_t n, float scalar, const float* vec, const float* res) {
    if (scalar != 0.0f)
        for (int64_t i = 0; i < n; ++i) y[i] += scalar;
    if (vec)
        for (int64_t i = 0; i < n; ++i) y[i] += vec[i];
    if (res)
        for (int64_t i = 0; i < n; ++i) y[i] += res[i];
}

// tanh as a clamped rational function (odd degree-13 numerator, even degree-6 denominator),
// accurate to about 1e-7 and, unlike tanhf, vectorizable.
inline float fastTanh(float x) {
    const float c = 7.90531110763549805f;
    x = x < -c ? -c : (x > c ? c : x);
    const float x2 = x * x;
    float p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * x;
    float q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return p / q;
}

// erf as a clamped rational function (erf(4) = 1 - 1.5e-8), vectorizable unlike erff.
inline float fastErf(float x) {
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    const float x2 = x * x;
    float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * x;
    float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return p / q;
}

// exp as Cephes' expf: x = n ln2 + r, a degree-6 polynomial in r, 2^n through the exponent
// bits (n rounded by the 1.5 * 2^23 trick, which needs no libm call): about 1 ulp, and
// vectorizable, unlike expf. Above 88.72 it gives inf as expf does; below -87.3 the smallest
// normal float (expf goes on into denormals: an error under 1.2e-38).
inline float fastExp(float x) {
    const float big = x > 88.7228394f ? std::numeric_limits<float>::infinity() : 0.0f;
    x = x < -87.3365479f ? -87.3365479f : (x > 88.0f ? 88.0f : x);
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
    const float t = x * 1.44269504088896341f + magic;
    const float n = t - magic;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(magic);
    const float scale = std::bit_cast<float>((e + 127) << 23);
    return big != 0.0f ? big : p * scale;
}

// log as Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) from a degree-9
// polynomial in m - 1, the exponent and the split ln2 added back; about 1 ulp, vectorizable
// (selects, no branches), unlike logf. Denormals are scaled up first; log(0) = -inf,
// log(inf) = inf, negatives and NaN give NaN, as logf.
inline float fastLog(float x) {
    const bool denormal = x < std::numeric_limits<float>::min();
    const float scaled = denormal ? x * 8388608.0f : x;  // 2^23
    const int32_t bits = std::bit_cast<int32_t>(scaled);
    float e = static_cast<float>(((bits >> 23) & 0xff) - 126) - (denormal ? 23.0f : 0.0f);
    float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f000000);  // in [0.5, 1)
    const bool low = m < 0.707106781186547524f;
    e = low ? e - 1.0f : e;
    m = low ? m + m - 1.0f : m - 1.0f;
    const float z = m * m;
    float p = 7.0376836292e-2f;
    p = p * m + -1.1514610310e-1f;
    p = p * m + 1.1676998740e-1f;
    p = p * m + -1.2420140846e-1f;
    p = p * m + 1.4249322787e-1f;
    p = p * m + -1.6668057665e-1f;
    p = p * m + 2.0000714765e-1f;
    p = p * m + -2.4999993993e-1f;
    p = p * m + 3.3333331174e-1f;
    float y = p * m * z + e * -2.12194440e-4f - 0.5f * z;
    y = m + y + e * 0.693359375f;
    constexpr float inf = std::numeric_limits<float>::infinity();
    y = x == inf ? inf : y;
    y = x == 0.0f ? -inf : y;
    return x < 0.0f || x != x ? std::numeric_limits<float>::quiet_NaN() : y;
}

KILN_CLONES void activateRow(float* y, int64_t n, ActKind kind, float a, float b) {
    switch (kind) {
        case ActKind::Erf:
            for (int64_t i = 0; i < n; ++i) y[i] = fastErf(y[i]);
            return;
        case ActKind::Gelu:
            for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * y[i] * (1.0f + fastErf(y[i] * 0.70710678118654752f));
            return;
        case ActKind::Tanh:
            for (int64_t i = 0; i < n; ++i) y[i] = fastTanh(y[i]);
            return;
        case ActKind::GeluTanh:
            for (int64_t i = 0; i < n; ++i) {
                const float v = y[i];
                y[i] = 0.5f * v * (1.0f + fastTanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
            }
            return;
        case ActKind::Sigmoid:
            for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + fastExp(-y[i]));
            return;
        case ActKind::Silu:
            for (int64_t i = 0; i < n; ++i) y[i] = y[i] / (1.0f + fastExp(-y[i]));
            return;
        case ActKind::Exp:
            for (int64_t i = 0; i < n; ++i) y[i] = fastExp(y[i]);
            return;
        case ActKind::None: return;
        case ActKind::Relu:
            for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
            return;
        case ActKind::Clip:
            for (int64_t i = 0; i < n; ++i) y[i] = y[i] < a ? a : (y[i] > b ? b : y[i]);
            return;
        case ActKind::LeakyRelu:
            for (int64_t i = 0; i < n; ++i) y[i] = y[i] >= 0.0f ? y[i] : a * y[i];
            return;
        case ActKind::HardSigmoid:
            for (int64_t i = 0; i < n; ++i) {
                const float t = a * y[i] + b;
                y[i] = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
            }
            return;
        case ActKind::Log:
            for (int64_t i = 0; i < n; ++i) y[i] = fastLog(y[i]);
            return;
        case ActKind::Sqrt:  // vsqrtps: this file is built without errno for math functions
            for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(y[i]);
            return;
        case ActKind::Neg:
            for (int64_t i = 0; i < n; ++i) y[i] = -y[i];
            return;
        case ActKind::Abs:
            for (int64_t i = 0; i < n; ++i) y[i] = std::fabs(y[i]);
            return;
        case ActKind::Reciprocal:
            for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / y[i];
            return;
        case ActKind::HardSwish:
            for (int64_t i = 0; i < n; ++i) {
                float t = y[i] / 6.0f + 0.5f;
                t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
                y[i] *= t;
            }
            return;
        default: break;
    }
    const Activation act{kind, a, b};
    for (int64_t i = 0; i < n; ++i) y[i] = activate(act, y[i]);
}

}  // namespace

void applyEpilogueSerial(float* y, int64_t rows, int64_t cols, const float* bias, bool bias_per_row, const float* residual, const Activation& act) {
    if (!bias && !residual && act.kind == ActKind::None) return;
    if (!bias && !residual) {  // activation only: one pass
        for (int64_t r = 0; r < rows; ++r) activateRow(y + r * cols, cols, act.kind, act.a, act.b);
        return;
    }
    for (int64_t r = 0; r < rows; ++r) {
        float* row = y + r * cols;
        addRow(row, cols, bias && bias_per_row ? bias[r] : 0.0f, bias && !bias_per_row ? bias : nullptr, residual ? residual + r * cols : nullptr);
        activateRow(row, cols, act.kind, act.a, act.b);
    }
}

void applyEpilogue(float* y, int64_t rows, int64_t cols, const float* bias, bool bias_per_row, const float* residual, const Activation& act) {
    if (!bias && !residual && act.kind == ActKind::None) return;
    // Adds and clamps are cheap next to a parallel region's cost up to 64K elements; a GELU,
    // erf, tanh or sigmoid costs tens of operations per element, worth both threads far sooner.
    const bool cheap = act.kind == ActKind::None || act.kind == ActKind::Relu || act.kind == ActKind::Clip || act.kind == ActKind::LeakyRelu;
    if (rows * cols <= (cheap ? 65536 : 4096) || rows < 2) return applyEpilogueSerial(y, rows, cols, bias, bias_per_row, residual, act);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float* row = y + r * cols;
        addRow(row, cols, bias && bias_per_row ? bias[r] : 0.0f, bias && !bias_per_row ? bias : nullptr, residual ? residual + r * cols : nullptr);
        activateRow(row, cols, act.kind, act.a, act.b);
    }
}

}  // namespace kiln
