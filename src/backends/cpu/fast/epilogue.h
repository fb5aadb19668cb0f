// Fused epilogues for the fast CPU kernels: bias, residual and activation applied in one
// vectorizable pass over a [rows, cols] block.
#pragma once
#include <cmath>
#include <string>

#include "ir/graph.h"

namespace kiln {

// Activations and the other unary steps elementwise chains use.
enum class ActKind { None, Relu, Clip, Sigmoid, Silu, Tanh, LeakyRelu, HardSigmoid, HardSwish, Gelu, GeluTanh, Softplus, Erf, Exp, Log, Sqrt, Neg, Abs, Reciprocal };

struct Activation {
    ActKind kind = ActKind::None;
    float a = 0, b = 0;
    // From a fused node's "activation"/"activation_params"; throws for unknown names.
    static Activation fromNode(const Node& n);
};

inline float activate(const Activation& act, float v) {
    switch (act.kind) {
        case ActKind::None: return v;
        case ActKind::Relu: return v > 0 ? v : 0;
        // std::min/max keep NaN as the reference kernels do, and compile to minss/maxss (std::fmin/fmax
        // are libm calls that drop NaN).
        case ActKind::Clip: return std::min(std::max(v, act.a), act.b);
        case ActKind::Sigmoid: return 1.0f / (1.0f + std::exp(-v));
        case ActKind::Silu: return v / (1.0f + std::exp(-v));
        case ActKind::Tanh: return std::tanh(v);
        case ActKind::LeakyRelu: return v >= 0 ? v : act.a * v;
        case ActKind::HardSigmoid: return std::min(std::max(act.a * v + act.b, 0.0f), 1.0f);
        case ActKind::HardSwish: return v * std::min(std::max(v / 6.0f + 0.5f, 0.0f), 1.0f);
        case ActKind::Gelu: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
        case ActKind::GeluTanh: return 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        case ActKind::Softplus: return v > 30 ? v : std::log1p(std::exp(v));
        case ActKind::Erf: return std::erf(v);
        case ActKind::Exp: return std::exp(v);
        case ActKind::Log: return std::log(v);
        case ActKind::Sqrt: return std::sqrt(v);
        case ActKind::Neg: return -v;
        case ActKind::Abs: return std::fabs(v);
        case ActKind::Reciprocal: return 1.0f / v;
    }
    return v;
}

// y[r, c] = act(y[r, c] + bias[c or r] + residual[r, c]); bias/residual may be null.
void applyEpilogue(float* y, int64_t rows, int64_t cols, const float* bias, bool bias_per_row, const float* residual, const Activation& act);
// The same without OpenMP, for use inside a parallel loop or on small blocks.
void applyEpilogueSerial(float* y, int64_t rows, int64_t cols, const float* bias, bool bias_per_row, const float* residual, const Activation& act);

}  // namespace kiln
