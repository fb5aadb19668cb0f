// GPU implementations of normalization, softmax, pooling and attention.
#include <cmath>

#include "backends/cpu/reference/kernel_util.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

std::vector<DeviceTensor> layerNorm(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    for (size_t o = 1; o < ctx.node.outputs.size(); ++o)
        if (!ctx.node.outputs[o].empty()) ctx.unsupported("Mean/InvStdDev outputs");
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t axis = ctx.attrs().getInt("axis", -1);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < rank, "axis out of range");
    int64_t cols = 1;
    for (int64_t d = axis; d < rank; ++d) cols *= x.dims[d];
    const DeviceTensor& scale = ctx.input(1);
    if (scale.numel() != cols || (ctx.has(2) && ctx.input(2).numel() != cols)) ctx.unsupported("broadcast scale/bias");
    if (!isDeviceFloat(scale.dtype) || (ctx.has(2) && ctx.input(2).dtype != scale.dtype)) ctx.unsupported("scale/bias types");
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchLayerNorm(t, scale.dtype, x.data, scale.data, ctx.has(2) ? ctx.input(2).data : nullptr, y.data, cols ? x.numel() / cols : 0, cols,
                    ctx.attrs().getFloat("epsilon", 1e-5f), ctx.stream());
    return {y};
}

std::vector<DeviceTensor> softmax(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    const bool legacy = ctx.opset < 13;
    int64_t axis = ctx.attrs().getInt("axis", legacy ? 1 : -1);
    if (axis < 0) axis += rank;
    ctx.require(axis >= 0 && axis < std::max<int64_t>(rank, 1), "axis out of range");
    if (!legacy && axis != rank - 1) ctx.unsupported("softmax over an inner axis");
    int64_t cols = 1;
    for (int64_t d = axis; d < rank; ++d) cols *= x.dims[d];
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchSoftmax(t, x.data, y.data, cols ? x.numel() / cols : 0, cols, ctx.node.op_type == "LogSoftmax", ctx.stream());
    return {y};
}

std::vector<DeviceTensor> pool(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    if (x.dims.size() != 4) ctx.unsupported("pooling of rank " + std::to_string(x.dims.size()));
    if (ctx.node.outputs.size() > 1 && !ctx.node.outputs[1].empty()) ctx.unsupported("MaxPool indices output");
    const bool is_max = ctx.node.op_type == "MaxPool";
    KernelContext attrs{ctx.node, {}, ctx.opset, nullptr};
    const Dims in_spatial{x.dims[2], x.dims[3]};
    auto kernel = ctx.attrs().getInts("kernel_shape");
    ctx.require(kernel.size() == 2, "kernel_shape must have 2 values");
    auto strides = ctx.attrs().getInts("strides", Dims(2, 1));
    auto dilations = ctx.attrs().getInts("dilations", Dims(2, 1));
    const bool ceil_mode = ctx.attrs().getInt("ceil_mode", 0) != 0;
    const bool include_pad = !is_max && ctx.attrs().getInt("count_include_pad", 0) != 0;
    if (include_pad && ceil_mode) ctx.unsupported("count_include_pad with ceil_mode");
    const SpatialPads pads = resolvePads(attrs, in_spatial, kernel, strides, dilations);
    const Dims out = poolOutputSpatial(attrs, in_spatial, kernel, strides, dilations, pads);
    Pool2d p{x.dims[0], x.dims[1], x.dims[2], x.dims[3], out[0], out[1], kernel[0], kernel[1], strides[0], strides[1],
             pads.begin[0], pads.begin[1], dilations[0], dilations[1], is_max, include_pad, false};
    DeviceTensor y = ctx.output(0, x.logical, Dims{x.dims[0], x.dims[1], out[0], out[1]});
    launchPool2d(t, p, x.data, y.data, ctx.stream());
    return {y};
}

std::vector<DeviceTensor> globalAveragePool(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    ctx.require(x.dims.size() >= 3, "input must have rank >= 3");
    Dims dims = {x.dims[0], x.dims[1]};
    dims.resize(x.dims.size(), 1);
    DeviceTensor y = ctx.output(0, x.logical, dims);
    const int64_t outer = x.dims[0] * x.dims[1];
    launchRowMean(t, x.data, y.data, outer, outer ? x.numel() / outer : 0, ctx.stream());
    return {y};
}

// softmax(Q Kt * scale + mask) V as two strided-batched tensor-core GEMMs around a
// scaled masked softmax; the scores live in scratch memory.
void attentionByGemm(OpContext& ctx, DType t, const DeviceTensor& out, int64_t batch, int64_t S, int64_t T, int64_t D, int64_t E, float scale,
                     const void* mask, DType mt, const View6& vm, const Shape6& score_shape) {
    const size_t score_bytes = static_cast<size_t>(batch * S * T) * sizeof(float);
    const size_t p_bytes = static_cast<size_t>(batch * S * T) * dtypeSize(t);
    char* scratch = static_cast<char*>(ctx.res.scratch(1, score_bytes + p_bytes + 256));
    float* scores = reinterpret_cast<float*>(scratch);
    void* p = scratch + ((score_bytes + 255) / 256) * 256;
    const float one = 1.f, zero = 0.f;
    const cublasComputeType_t compute = t == DType::F32 ? (ctx.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
    const cudaDataType_t ct = cudaTypeOf(t);
    cublasStatus_t st = cublasGemmStridedBatchedEx(ctx.res.blas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(T), static_cast<int>(S), static_cast<int>(D),
                                                   &one, ctx.input(1).data, ct, static_cast<int>(T), D * T, ctx.input(0).data, ct,
                                                   static_cast<int>(D), S * D, &zero, scores, CUDA_R_32F, static_cast<int>(T), S * T,
                                                   static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT);
    ctx.require(st == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS attention scores: ") + cublasGetStatusString(st));
    launchScaledMaskedSoftmax(t, scores, scale, mt, mask, vm, score_shape, p, ctx.stream());
    st = cublasGemmStridedBatchedEx(ctx.res.blas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(E), static_cast<int>(S), static_cast<int>(T), &one,
                                    ctx.input(2).data, ct, static_cast<int>(E), T * E, p, ct, static_cast<int>(T), S * T, &zero, out.data, ct,
                                    static_cast<int>(E), S * E, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT);
    ctx.require(st == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS attention output: ") + cublasGetStatusString(st));
}

std::vector<DeviceTensor> attention(OpContext& ctx) {
    const DeviceTensor& q = ctx.input(0);
    const DeviceTensor& kt = ctx.input(1);
    const DeviceTensor& v = ctx.input(2);
    const DType t = ctx.floatType(0);
    if (kt.dtype != t || v.dtype != t) ctx.unsupported("mixed element types");
    const size_t rank = q.dims.size();
    if (rank < 2 || kt.dims.size() != rank || v.dims.size() != rank) ctx.unsupported("inputs of different ranks");
    int64_t batch = 1;
    for (size_t d = 0; d + 2 < rank; ++d) {
        if (kt.dims[d] != q.dims[d] || v.dims[d] != q.dims[d]) ctx.unsupported("broadcast batch dims");
        batch *= q.dims[d];
    }
    const int64_t S = q.dims[rank - 2], D = q.dims[rank - 1], T = kt.dims[rank - 1], E = v.dims[rank - 1];
    ctx.require(kt.dims[rank - 2] == D && v.dims[rank - 2] == T, "Q, Kt and V shapes do not chain");
    Dims score_dims(q.dims.begin(), q.dims.end() - 1);
    score_dims.push_back(T);
    const Shape6 score_shape = toShape6(score_dims, ctx);
    const void* mask = nullptr;
    DType mt = t;
    View6 vm;
    if (ctx.has(3)) {
        const DeviceTensor& m = ctx.input(3);
        if (!isDeviceFloat(m.dtype)) ctx.unsupported("mask type");
        const Dims bd = broadcastDims(score_dims, m.dims, ctx.node.describe());
        if (bd != score_dims) ctx.unsupported("mask larger than the scores");
        mask = m.data;
        mt = m.dtype;
        vm = broadcastView(m.dims, score_dims, ctx);
    }
    Dims out_dims(q.dims.begin(), q.dims.end() - 1);
    out_dims.push_back(E);
    DeviceTensor out = ctx.output(0, q.logical, out_dims);
    const float scale = ctx.attrs().getFloat("scale", 1.0f);
    const bool fused_ok = T <= kFusedAttentionMaxKeys && D <= kFusedAttentionMaxHead && E <= kFusedAttentionMaxHead && batch < 65536;
    auto fused = [&] { launchFusedAttention(t, q.data, kt.data, v.data, mt, mask, vm, score_shape, out.data, batch, S, T, D, E, scale, ctx.stream()); };
    auto gemm = [&] { attentionByGemm(ctx, t, out, batch, S, T, D, E, scale, mask, mt, vm, score_shape); };
    std::string choice = ctx.tactic;
    if (choice.empty()) {
        const std::string wanted = routeValue(ctx.route, "tactic.cuda.attention");
        if (wanted != "auto") choice = wanted;
        else if (!fused_ok) choice = "gemm";
        else if (ctx.calibrate) choice = timeOnStream(ctx.stream(), fused) <= timeOnStream(ctx.stream(), gemm) ? "fused" : "gemm";
        else choice = batch * S <= 8192 ? "fused" : "gemm";  // no timing: short sequences fuse
    }
    if (choice == "fused" && !fused_ok) choice = "gemm";
    ctx.chosen_tactic = choice;
    if (choice == "fused") fused();
    else gemm();
    return {out};
}

}  // namespace

void addNnOps(std::map<std::string, OpFn>& ops) {
    ops["LayerNormalization"] = layerNorm;
    ops["Softmax"] = softmax;
    ops["LogSoftmax"] = softmax;
    ops["MaxPool"] = pool;
    ops["AveragePool"] = pool;
    ops["GlobalAveragePool"] = globalAveragePool;
    ops["Attention"] = attention;
}

}  // namespace kiln::cuda
