// The elementwise part of one LSTM, GRU or RNN step on the GPU (the matrix products are
// cuBLAS calls around it), and the moves of the states between the node's layouts and the
// f32 [D, B, H] state the steps update. Gate orders and formulas are ONNX's, with the
// default activations.
#include "backends/cuda/kernels/device_math.cuh"

namespace kiln::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }

template <typename T>
__global__ void cellKernel(RecurrentCell c, int64_t step, const float* xw, const float* hr, const float* hn, const float* bias, float* h,
                           float* cell, float* rh, T* y) {
    const int64_t n = c.D * c.B * c.H;
    const int64_t G = c.gates, GH = G * c.H;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t j = i % c.H, b = (i / c.H) % c.B, d = i / (c.H * c.B);
        const bool reverse = c.reverse_first ? d == 0 : d == 1;
        const int64_t t = reverse ? c.S - 1 - step : step;
        const int64_t row = c.batch_major ? b * c.S + t : t * c.B + b;
        const float* x = xw + row * (c.D * GH) + d * GH;
        const float* r = hr + (d * c.B + b) * GH;
        const float* wb = bias ? bias + d * 2 * GH : nullptr;
        auto pre = [&](int64_t g) {  // x·W + h·R + Wb + Rb of gate g
            float v = x[g * c.H + j] + r[g * c.H + j];
            return wb ? v + wb[g * c.H + j] + wb[GH + g * c.H + j] : v;
        };
        float out;
        if (c.kind == RecurrentKind::Lstm) {  // gates i, o, f, c
            const float ig = sigmoid(pre(0)), og = sigmoid(pre(1)), fg = sigmoid(pre(2)), cg = tanhf(pre(3));
            const float cn = fg * cell[i] + ig * cg;
            cell[i] = cn;
            out = og * tanhf(cn);
        } else if (c.kind == RecurrentKind::Rnn) {
            out = tanhf(pre(0));
        } else {  // GRU: gates z, r, h
            const float z = sigmoid(pre(0)), rg = sigmoid(pre(1));
            if (c.kind == RecurrentKind::GruResetGate) {  // first half without linear_before_reset: r ⊙ h for the second product
                rh[i] = rg * h[i];
                continue;
            }
            float xn = x[2 * c.H + j] + (wb ? wb[2 * c.H + j] : 0.f);
            float hpart = c.kind == RecurrentKind::GruLinearBeforeReset ? rg * (r[2 * c.H + j] + (wb ? wb[GH + 2 * c.H + j] : 0.f))
                                                                        : hn[(d * c.B + b) * c.H + j] + (wb ? wb[GH + 2 * c.H + j] : 0.f);
            const float nn = tanhf(xn + hpart);
            out = (1.f - z) * nn + z * h[i];
        }
        h[i] = out;
        if (y) {
            const int64_t at = c.batch_major ? ((b * c.S + t) * c.D + d) * c.H + j : ((t * c.D + d) * c.B + b) * c.H + j;
            y[at] = fromFloat<T>(out);
        }
    }
}

// Between the node's state layout ([D, B, H], or [B, D, H] when batch-major) in type T and
// the f32 [D, B, H] state.
template <typename T>
__global__ void stateKernel(bool to_state, bool batch_major, int64_t D, int64_t B, int64_t H, const void* src, void* dst) {
    const int64_t n = D * B * H;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t j = i % H, b = (i / H) % B, d = i / (H * B);
        const int64_t node = batch_major ? (b * D + d) * H + j : i;
        if (to_state) static_cast<float*>(dst)[i] = toFloat(static_cast<const T*>(src)[node]);
        else static_cast<T*>(dst)[node] = fromFloat<T>(static_cast<const float*>(src)[i]);
    }
}

}  // namespace

void launchRecurrentCell(DType t, const RecurrentCell& c, int64_t step, const float* xw, const float* hr, const float* hn, const float* bias,
                         float* h, float* cell, float* rh, void* y, cudaStream_t s) {
    const int64_t n = c.D * c.B * c.H;
    if (n == 0) return;
    clearStaleError();
    dispatchDeviceFloat(t, "recurrent cell", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        cellKernel<T><<<gridFor(n, 256), 256, 0, s>>>(c, step, xw, hr, hn, bias, h, cell, rh, static_cast<T*>(y));
    });
    checkLaunch("recurrent cell");
}

void launchRecurrentState(DType t, bool to_state, bool batch_major, int64_t D, int64_t B, int64_t H, const void* src, void* dst, cudaStream_t s) {
    const int64_t n = D * B * H;
    if (n == 0) return;
    clearStaleError();
    dispatchDeviceFloat(t, "recurrent state", [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        stateKernel<T><<<gridFor(n, 256), 256, 0, s>>>(to_state, batch_major, D, B, H, src, dst);
    });
    checkLaunch("recurrent state");
}

}  // namespace kiln::cuda
