// LSTM, GRU and RNN on the GPU, for the cells exporters emit: default activations, no clip,
// no peepholes, every sequence at full length. The input projection of all steps is one
// cuBLAS GEMM (f32 out); each step is a batched GEMM of the f32 states with R (over the
// directions) and one elementwise kernel. Other forms run on the host.
#include <cctype>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"
#include "backends/cuda/device_buffer.h"

namespace kiln::cuda {

namespace {

#define KILN_BLAS_CHECK(call, ctx)                                                                              \
    do {                                                                                                         \
        const cublasStatus_t kiln_blas_ = (call);                                                                \
        (ctx).require(kiln_blas_ == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS ") + #call + ": " + cublasGetStatusString(kiln_blas_)); \
    } while (0)

// R and B in f32 (the states are f32), converted once per signature.
struct RecurrentWeights : NodeState {
    DeviceBuffer r, bias;
};

// Row-major C[M,N] (+)= A[M,K] · B[N,K]^T in column-major cuBLAS terms, `batch` times with
// element strides sa, sb, sc. Output f32; A and B of type ab.
void gemmNT(OpContext& ctx, cudaDataType_t ab, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb,
            int64_t sb, float* C, int64_t ldc, int64_t sc, int64_t batch) {
    const float one = 1.f, zero = 0.f;
    const cublasComputeType_t compute = ctx.tf32 && ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    KILN_BLAS_CHECK(cublasGemmStridedBatchedEx(ctx.res.blas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &one,
                                               B, ab, static_cast<int>(ldb), sb, A, ab, static_cast<int>(lda), sa, &zero, C, CUDA_R_32F,
                                               static_cast<int>(ldc), sc, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
                    ctx);
}

std::vector<DeviceTensor> recurrent(OpContext& ctx) {
    const std::string& op = ctx.node.op_type;
    const bool lstm = op == "LSTM", gru = op == "GRU";
    const DeviceTensor& x = ctx.input(0);
    const DeviceTensor& w = ctx.input(1);
    const DeviceTensor& r = ctx.input(2);
    const DType t = ctx.floatType(0);
    ctx.require(x.dims.size() == 3 && r.dims.size() == 3, "X and R must be rank 3");
    if (w.dtype != t || r.dtype != t) ctx.unsupported("weights stored in another type than X");
    RecurrentCell c;
    c.gates = lstm ? 4 : gru ? 3 : 1;
    c.batch_major = ctx.attrs().getInt("layout", 0) != 0;
    c.S = x.dims[c.batch_major ? 1 : 0], c.B = x.dims[c.batch_major ? 0 : 1];
    const int64_t I = x.dims[2];
    const std::string direction = ctx.attrs().getString("direction", "forward");
    ctx.require(direction == "forward" || direction == "reverse" || direction == "bidirectional", "direction '" + direction + "' is not forward, reverse or bidirectional");
    c.D = direction == "bidirectional" ? 2 : 1;
    c.reverse_first = direction == "reverse";
    c.H = ctx.attrs().getInt("hidden_size", r.dims[2]);
    const int64_t D = c.D, B = c.B, H = c.H, S = c.S, GH = c.gates * c.H;
    ctx.require(w.dims == Dims{D, GH, I} && r.dims == Dims{D, GH, H}, "W and R do not match hidden_size, the directions and X");
    // The forms the kernel computes.
    const std::vector<std::string> defaults = lstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"} : gru ? std::vector<std::string>{"Sigmoid", "Tanh"} : std::vector<std::string>{"Tanh"};
    if (ctx.attrs().has("activations")) {
        const auto acts = ctx.attrs().getStrings("activations");
        auto lower = [](std::string v) {
            for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
            return v;
        };
        for (size_t i = 0; i < acts.size(); ++i)  // names as the reference reads them: any case
            if (lower(acts[i]) != lower(defaults[i % defaults.size()])) ctx.unsupported("activation " + acts[i]);
    }
    if (ctx.attrs().has("clip")) ctx.unsupported("clip");
    if (lstm && ctx.attrs().getInt("input_forget", 0) != 0) ctx.unsupported("input_forget");
    if (lstm && ctx.has(7)) ctx.unsupported("peepholes");
    if (ctx.has(4)) {
        if (!ctx.inputs[4]->host) ctx.unsupported("sequence_lens computed on the device");
        for (int64_t len : ctx.inputs[4]->host->toInt64Vector())
            if (len != S) ctx.unsupported("sequences shorter than the input");
    }
    c.kind = lstm ? RecurrentKind::Lstm : !gru ? RecurrentKind::Rnn : ctx.attrs().getInt("linear_before_reset", 0) != 0 ? RecurrentKind::GruLinearBeforeReset : RecurrentKind::Gru;
    const bool has_bias = ctx.has(3);
    if (has_bias) ctx.require(ctx.input(3).dims == Dims{D, 2 * GH}, "B must be [directions, 2 * gates * hidden_size]");

    auto& state = *ctx.state;
    if (!state) {
        auto weights = std::make_unique<RecurrentWeights>();
        weights->r.ensure(static_cast<size_t>(r.numel()) * sizeof(float));
        launchCast(t, DType::F32, r.data, weights->r.ptr, r.numel(), ctx.stream());
        if (has_bias) {
            const DeviceTensor& b = ctx.input(3);
            weights->bias.ensure(static_cast<size_t>(b.numel()) * sizeof(float));
            launchCast(b.dtype, DType::F32, b.data, weights->bias.ptr, b.numel(), ctx.stream());
        }
        state = std::move(weights);
    }
    const auto& weights = static_cast<const RecurrentWeights&>(*state);

    // Temporaries in f32: x·W^T for all steps, h·R^T for one, the states, GRU's r ⊙ h and its product.
    const int64_t dbh = D * B * H;
    const size_t xw_n = static_cast<size_t>(S * B * D * GH), hr_n = static_cast<size_t>(D * B * GH), st = static_cast<size_t>(dbh);
    float* xw = static_cast<float*>(ctx.res.scratch(1, (xw_n + hr_n + 4 * st) * sizeof(float)));
    float *hr = xw + xw_n, *h = hr + hr_n, *cell = h + st, *rh = cell + st, *hn = rh + st;
    gemmNT(ctx, cudaTypeOf(t), S * B, D * GH, I, x.data, I, 0, w.data, I, 0, xw, D * GH, 0, 1);
    for (int k = 0; k < (lstm ? 2 : 1); ++k) {
        const size_t in = k == 0 ? 5 : 6;
        float* dst = k == 0 ? h : cell;
        if (ctx.has(in)) {
            const DeviceTensor& s0 = ctx.input(in);
            ctx.require(s0.dims == (c.batch_major ? Dims{B, D, H} : Dims{D, B, H}), "initial state of the wrong shape");
            launchRecurrentState(s0.dtype, true, c.batch_major, D, B, H, s0.data, dst, ctx.stream());
        } else {
            KILN_CUDA_CHECK(cudaMemsetAsync(dst, 0, st * sizeof(float), ctx.stream()));
        }
    }
    const Dims y_dims = c.batch_major ? Dims{B, S, D, H} : Dims{S, D, B, H};
    const bool want_y = !ctx.node.outputs.empty() && !ctx.node.outputs[0].empty();
    DeviceTensor y = want_y ? ctx.output(0, x.logical, y_dims) : DeviceTensor{};
    const float* bias = has_bias ? weights.bias.as<float>() : nullptr;
    const float* rf = weights.r.as<float>();
    for (int64_t step = 0; step < S; ++step) {
        gemmNT(ctx, CUDA_R_32F, B, GH, H, h, H, B * H, rf, H, GH * H, hr, GH, B * GH, D);
        if (c.kind == RecurrentKind::Gru) {  // (r ⊙ h)·Rh^T between the two halves of the step
            RecurrentCell first = c;
            first.kind = RecurrentKind::GruResetGate;
            launchRecurrentCell(t, first, step, xw, hr, nullptr, bias, h, cell, rh, nullptr, ctx.stream());
            gemmNT(ctx, CUDA_R_32F, B, H, H, rh, H, B * H, rf + 2 * H * H, H, GH * H, hn, H, B * H, D);
        }
        launchRecurrentCell(t, c, step, xw, hr, hn, bias, h, cell, rh, want_y ? y.data : nullptr, ctx.stream());
    }
    std::vector<DeviceTensor> outs = {y};
    const Dims state_dims = c.batch_major ? Dims{B, D, H} : Dims{D, B, H};
    for (size_t k = 1; k < ctx.node.outputs.size() && k <= (lstm ? 2u : 1u); ++k) {
        if (ctx.node.outputs[k].empty()) {
            outs.emplace_back();
            continue;
        }
        DeviceTensor s = ctx.output(k, x.logical, state_dims);
        launchRecurrentState(s.dtype, false, c.batch_major, D, B, H, k == 1 ? h : cell, s.data, ctx.stream());
        outs.push_back(s);
    }
    return outs;
}

}  // namespace

void addRecurrentOps(std::map<std::string, OpFn>& ops) {
    ops["LSTM"] = recurrent;
    ops["GRU"] = recurrent;
    ops["RNN"] = recurrent;
}

}  // namespace kiln::cuda
