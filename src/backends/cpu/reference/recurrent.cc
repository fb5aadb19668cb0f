#include "backends/cpu/reference/recurrent.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/reference/kernel_util.h"

namespace kiln {

namespace {

enum class Act { Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus };

struct Activation {
    Act kind = Act::Sigmoid;
    float alpha = 0, beta = 0;

    float operator()(float x) const {
        switch (kind) {
            case Act::Sigmoid: return 1.0f / (1.0f + std::exp(-x));
            case Act::Tanh: return std::tanh(x);
            case Act::Relu: return std::max(x, 0.0f);
            case Act::Affine: return alpha * x + beta;
            case Act::LeakyRelu: return x >= 0 ? x : alpha * x;
            case Act::ThresholdedRelu: return x > alpha ? x : 0.0f;
            case Act::ScaledTanh: return alpha * std::tanh(beta * x);
            case Act::HardSigmoid: return std::clamp(alpha * x + beta, 0.0f, 1.0f);
            case Act::Elu: return x >= 0 ? x : alpha * (std::exp(x) - 1.0f);
            case Act::Softsign: return x / (1.0f + std::fabs(x));
            case Act::Softplus: return x > 20.0f ? x : std::log1p(std::exp(x));
        }
        return x;
    }
};

// The activations of each direction, `per` of them (f, g[, h]), from the attributes.
// alpha and beta are consumed in order by the functions that take them (as ONNX Runtime
// reads them); the defaults are those of the ONNX operators of the same names.
std::vector<Activation> parseActivations(const KernelContext& ctx, std::vector<std::string> names, size_t per, size_t dirs) {
    if (ctx.attrs().has("activations")) names = ctx.attrs().getStrings("activations");
    if (names.size() == per && dirs == 2) {
        const std::vector<std::string> forward = names;  // the same functions both ways
        names.insert(names.end(), forward.begin(), forward.end());
    }
    ctx.require(names.size() == per * dirs, [&] {
        return "activations lists " + std::to_string(names.size()) + " functions, " + std::to_string(per * dirs) + " are needed";
    });
    const std::vector<float> alphas = ctx.attrs().getFloats("activation_alpha"), betas = ctx.attrs().getFloats("activation_beta");
    size_t next_alpha = 0, next_beta = 0;
    auto alpha = [&](float fallback) { return next_alpha < alphas.size() ? alphas[next_alpha++] : fallback; };
    auto beta = [&](float fallback) { return next_beta < betas.size() ? betas[next_beta++] : fallback; };
    std::vector<Activation> out;
    for (std::string name : names) {
        std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        Activation a;
        if (name == "sigmoid") a.kind = Act::Sigmoid;
        else if (name == "tanh") a.kind = Act::Tanh;
        else if (name == "relu") a.kind = Act::Relu;
        else if (name == "affine") a = {Act::Affine, alpha(1.0f), beta(0.0f)};
        else if (name == "leakyrelu") a = {Act::LeakyRelu, alpha(0.01f), 0};
        else if (name == "thresholdedrelu") a = {Act::ThresholdedRelu, alpha(1.0f), 0};
        else if (name == "scaledtanh") a = {Act::ScaledTanh, alpha(1.0f), beta(1.0f)};
        else if (name == "hardsigmoid") a = {Act::HardSigmoid, alpha(0.2f), beta(0.5f)};
        else if (name == "elu") a = {Act::Elu, alpha(1.0f), 0};
        else if (name == "softsign") a.kind = Act::Softsign;
        else if (name == "softplus") a.kind = Act::Softplus;
        else ctx.fail("unknown activation '" + name + "'");
        out.push_back(a);
    }
    return out;
}

// [d0, d1, rest] -> [d1, d0, rest]: the batch-major layout (layout=1) to time-major and back.
std::vector<float> swapLeadingAxes(const float* x, int64_t d0, int64_t d1, int64_t rest) {
    std::vector<float> out(static_cast<size_t>(d0 * d1 * rest));
    for (int64_t a = 0; a < d0; ++a)
        for (int64_t b = 0; b < d1; ++b) std::memcpy(&out[static_cast<size_t>((b * d0 + a) * rest)], x + (a * d1 + b) * rest, static_cast<size_t>(rest) * sizeof(float));
    return out;
}

void requireDims(const KernelContext& ctx, const Tensor& t, const Dims& want, const char* what) {
    ctx.require(t.dims() == want, [&] { return std::string(what) + " has shape " + dimsToString(t.dims()) + ", expected " + dimsToString(want); });
    ctx.require(t.dtype() == DType::F32, [&] { return std::string(what) + " must be f32, it is " + std::string(dtypeName(t.dtype())); });
}

}  // namespace

RecurrentProblem recurrentProblem(const KernelContext& ctx) {
    RecurrentProblem p;
    const std::string& op = ctx.node.op_type;
    p.lstm = op == "LSTM", p.gru = op == "GRU";
    p.G = p.lstm ? 4 : p.gru ? 3 : 1;
    const Tensor& x = ctx.input(0);
    ctx.require(x.rank() == 3 && x.dtype() == DType::F32, [&] { return "X must be a rank-3 f32 tensor, it is " + x.summary(); });
    p.batch_major = ctx.attrs().getInt("layout", 0) != 0;
    p.S = x.dims()[p.batch_major ? 1 : 0], p.B = x.dims()[p.batch_major ? 0 : 1], p.I = x.dims()[2];
    p.direction = ctx.attrs().getString("direction", "forward");
    ctx.require(p.direction == "forward" || p.direction == "reverse" || p.direction == "bidirectional",
                [&] { return "direction '" + p.direction + "' is not forward, reverse or bidirectional"; });
    p.D = p.direction == "bidirectional" ? 2 : 1;
    const Tensor& r = ctx.input(2);
    ctx.require(r.rank() == 3, [&] { return "R must be rank 3, it is " + r.summary(); });
    p.H = ctx.attrs().getInt("hidden_size", r.dims()[2]);
    ctx.require(p.H > 0, "hidden_size must be positive");
    const int64_t GH = p.G * p.H, S = p.S, B = p.B, D = p.D, H = p.H;
    requireDims(ctx, ctx.input(1), {D, GH, p.I}, "W");
    requireDims(ctx, r, {D, GH, H}, "R");
    if (const Tensor* bias = ctx.optionalInput(3)) requireDims(ctx, *bias, {D, 2 * GH}, "B");
    p.lens.assign(static_cast<size_t>(B), S);
    if (const Tensor* sl = ctx.optionalInput(4)) {
        ctx.require(sl->numel() == B, "sequence_lens must hold one length per batch row");
        for (int64_t b = 0; b < B; ++b) {
            p.lens[static_cast<size_t>(b)] = static_cast<int64_t>(sl->scalarAt(b));
            ctx.require(p.lens[static_cast<size_t>(b)] >= 0 && p.lens[static_cast<size_t>(b)] <= S, "sequence_lens has a length outside [0, sequence length]");
        }
    }
    const Dims state_dims = p.batch_major ? Dims{B, D, H} : Dims{D, B, H};
    auto timeMajorState = [&](size_t i, const char* what) -> std::vector<float> {
        const Tensor* t = ctx.optionalInput(i);
        if (!t) return std::vector<float>(static_cast<size_t>(D * B * H), 0.0f);
        requireDims(ctx, *t, state_dims, what);
        return p.batch_major ? swapLeadingAxes(t->data<float>(), B, D, H) : std::vector<float>(t->data<float>(), t->data<float>() + t->numel());
    };
    p.h = timeMajorState(5, "initial_h");
    if (p.lstm) p.c = timeMajorState(6, "initial_c");
    tensorBytes(DType::F32, {S, D, B, H}, ctx.node.describe() + " output Y");
    tensorBytes(DType::F32, {S, B, GH}, ctx.node.describe() + " input projection");
    p.xs = p.batch_major ? swapLeadingAxes(x.data<float>(), B, S, p.I) : std::vector<float>(x.data<float>(), x.data<float>() + x.numel());
    return p;
}

std::vector<Tensor> recurrentOutputs(const RecurrentProblem& p, const std::vector<float>& y) {
    std::vector<Tensor> outs;
    auto emit = [&](const std::vector<float>& v, int64_t lead, int64_t second, int64_t rest, const Dims& time_major, const Dims& batch_major_dims) {
        Tensor t = Tensor::uninitialized(DType::F32, p.batch_major ? batch_major_dims : time_major);
        if (p.batch_major) {
            const std::vector<float> data = swapLeadingAxes(v.data(), lead, second, rest);
            std::memcpy(t.raw(), data.data(), data.size() * sizeof(float));
        } else {
            std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
        }
        outs.push_back(std::move(t));
    };
    // Time-major [S, dirs, B, H] is batch-major [B, S, dirs, H] with [S*dirs, B] swapped.
    emit(y, p.S * p.D, p.B, p.H, {p.S, p.D, p.B, p.H}, {p.B, p.S, p.D, p.H});
    emit(p.h, p.D, p.B, p.H, {p.D, p.B, p.H}, {p.B, p.D, p.H});
    if (p.lstm) emit(p.c, p.D, p.B, p.H, {p.D, p.B, p.H}, {p.B, p.D, p.H});
    return outs;
}

std::vector<Tensor> recurrentKernel(const KernelContext& ctx, RecurrentGemm gemm) {
    RecurrentProblem p = recurrentProblem(ctx);
    const bool lstm = p.lstm, gru = p.gru;
    const size_t per = lstm ? 3 : gru ? 2 : 1;  // activation functions per direction: f, g[, h]
    const int64_t S = p.S, B = p.B, I = p.I, D = p.D, H = p.H, GH = p.G * p.H;
    const std::string& direction = p.direction;
    const std::vector<int64_t>& lens = p.lens;
    const Tensor& w = ctx.input(1);
    const Tensor& r = ctx.input(2);
    const Tensor* bias = ctx.optionalInput(3);
    std::vector<float>& h_all = p.h;
    std::vector<float>& c_all = p.c;
    const Tensor* peep = lstm ? ctx.optionalInput(7) : nullptr;
    if (peep) requireDims(ctx, *peep, {D, 3 * H}, "P");
    const float clip = ctx.attrs().has("clip") ? ctx.attrs().getFloat("clip", 0) : std::numeric_limits<float>::infinity();
    ctx.require(clip > 0, "clip must be positive");
    const bool input_forget = lstm && ctx.attrs().getInt("input_forget", 0) != 0;
    const bool linear_before_reset = gru && ctx.attrs().getInt("linear_before_reset", 0) != 0;
    const std::vector<std::string> default_acts = lstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"} : gru ? std::vector<std::string>{"Sigmoid", "Tanh"} : std::vector<std::string>{"Tanh"};
    const std::vector<Activation> acts = parseActivations(ctx, default_acts, per, static_cast<size_t>(D));
    const std::vector<float>& xs = p.xs;
    std::vector<float> y(static_cast<size_t>(S * D * B * H), 0.0f);
    std::vector<float> xw(static_cast<size_t>(S * B * GH)), hr(static_cast<size_t>(B * GH)), rh(static_cast<size_t>(B * H)), hr_bias(static_cast<size_t>(GH));
    auto clipped = [clip](float v) { return std::clamp(v, -clip, clip); };
    for (int64_t d = 0; d < D; ++d) {
        const bool reverse = direction == "reverse" || d == 1;
        const Activation* fn = &acts[static_cast<size_t>(d) * per];
        const Activation f = fn[0], g = per > 1 ? fn[1] : f, hact = per > 2 ? fn[2] : f;
        const float* wd = w.data<float>() + d * GH * I;
        const float* rd = r.data<float>() + d * GH * H;
        const float* wb = bias ? bias->data<float>() + d * 2 * GH : nullptr;
        const float* rb = wb ? wb + GH : nullptr;
        // The input projection of every step at once, with the biases that add outside the
        // recurrence; GRU with linear_before_reset keeps R's h-gate bias inside it.
        std::fill(hr_bias.begin(), hr_bias.end(), 0.0f);
        for (int64_t row = 0; row < S * B; ++row)
            for (int64_t j = 0; j < GH; ++j) {
                float v = wb ? wb[j] : 0.0f;
                if (rb && !(linear_before_reset && j >= 2 * H)) v += rb[j];
                xw[static_cast<size_t>(row * GH + j)] = v;
            }
        if (rb && linear_before_reset)
            for (int64_t j = 2 * H; j < GH; ++j) hr_bias[static_cast<size_t>(j)] = rb[j];
        if (S * B > 0) gemm(S * B, GH, I, xs.data(), I, wd, I, xw.data(), GH);
        float* h = h_all.data() + d * B * H;
        float* c = lstm ? c_all.data() + d * B * H : nullptr;
        const float* pi = peep ? peep->data<float>() + d * 3 * H : nullptr;
        const float* po = pi ? pi + H : nullptr;
        const float* pf = pi ? pi + 2 * H : nullptr;
        for (int64_t step = 0; step < S; ++step) {
            for (int64_t b = 0; b < B; ++b) std::memcpy(&hr[static_cast<size_t>(b * GH)], hr_bias.data(), static_cast<size_t>(GH) * sizeof(float));
            // GRU without linear_before_reset multiplies the reset gate in before R's h rows.
            const int64_t first_rows = gru && !linear_before_reset ? 2 * H : GH;
            gemm(B, first_rows, H, h, H, rd, H, hr.data(), GH);
            if (gru && !linear_before_reset) {
                for (int64_t b = 0; b < B; ++b) {
                    const int64_t t = reverse ? lens[static_cast<size_t>(b)] - 1 - step : step;
                    const float* xr = &xw[static_cast<size_t>((std::max<int64_t>(t, 0) * B + b) * GH)];
                    for (int64_t j = 0; j < H; ++j) {
                        const float rgate = f(clipped(xr[H + j] + hr[static_cast<size_t>(b * GH + H + j)]));
                        rh[static_cast<size_t>(b * H + j)] = rgate * h[b * H + j];
                    }
                }
                gemm(B, H, H, rh.data(), H, rd + 2 * H * H, H, hr.data() + 2 * H, GH);
            }
            for (int64_t b = 0; b < B; ++b) {
                if (step >= lens[static_cast<size_t>(b)]) continue;  // past this row's end: state kept, Y stays 0
                const int64_t t = reverse ? lens[static_cast<size_t>(b)] - 1 - step : step;
                const float* xr = &xw[static_cast<size_t>((t * B + b) * GH)];
                const float* hrow = &hr[static_cast<size_t>(b * GH)];
                float* hb = h + b * H;
                if (lstm) {
                    float* cb = c + b * H;
                    for (int64_t j = 0; j < H; ++j) {
                        const float c_prev = cb[j];
                        const float i = f(clipped(xr[j] + hrow[j] + (pi ? pi[j] * c_prev : 0.0f)));
                        const float fg = input_forget ? 1.0f - i : f(clipped(xr[2 * H + j] + hrow[2 * H + j] + (pf ? pf[j] * c_prev : 0.0f)));
                        const float cand = g(clipped(xr[3 * H + j] + hrow[3 * H + j]));
                        const float cn = fg * c_prev + i * cand;
                        const float o = f(clipped(xr[H + j] + hrow[H + j] + (po ? po[j] * cn : 0.0f)));
                        cb[j] = cn;
                        hb[j] = o * hact(cn);
                    }
                } else if (gru) {
                    for (int64_t j = 0; j < H; ++j) {
                        const float z = f(clipped(xr[j] + hrow[j]));
                        const float recur = linear_before_reset ? f(clipped(xr[H + j] + hrow[H + j])) * hrow[2 * H + j] : hrow[2 * H + j];
                        const float cand = g(clipped(xr[2 * H + j] + recur));
                        hb[j] = (1.0f - z) * cand + z * hb[j];
                    }
                } else {
                    for (int64_t j = 0; j < H; ++j) hb[j] = f(clipped(xr[j] + hrow[j]));
                }
                std::memcpy(&y[static_cast<size_t>(((t * D + d) * B + b) * H)], hb, static_cast<size_t>(H) * sizeof(float));
            }
        }
    }
    return recurrentOutputs(p, y);
}

namespace {

void naiveGemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* Bm, int64_t ldb, float* C, int64_t ldc) {
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(A[m * lda + k]) * Bm[n * ldb + k];
            C[m * ldc + n] += static_cast<float>(acc);
        }
}

std::vector<Tensor> referenceRecurrent(const KernelContext& ctx) { return recurrentKernel(ctx, naiveGemm); }

}  // namespace

void registerRecurrentKernels(KernelRegistry& r) {
    r.add("LSTM", referenceRecurrent);
    r.add("GRU", referenceRecurrent);
    r.add("RNN", referenceRecurrent);
}

}  // namespace kiln
