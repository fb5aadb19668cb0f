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

// InstanceNormalization: each (n, c) plane normalized on its own, then scale[c] and B[c];
// Wav2Vec2's first GroupNorm (one group per channel) exports as one.
std::vector<DeviceTensor> instanceNorm(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DType t = ctx.floatType(0);
    ctx.require(x.dims.size() >= 3, "input must have rank 3 or more");
    const int64_t c = x.dims[1], inner = c ? x.numel() / (x.dims[0] * c) : 0;
    const DeviceTensor& scale = ctx.input(1);
    const DeviceTensor& bias = ctx.input(2);
    ctx.require(scale.numel() == c && bias.numel() == c, "scale and B must hold one value per channel");
    if (!isDeviceFloat(scale.dtype) || bias.dtype != scale.dtype) ctx.unsupported("scale/B types");
    DeviceTensor y = ctx.output(0, x.logical, x.dims);
    launchLayerNorm(t, scale.dtype, x.data, scale.data, bias.data, y.data, x.dims[0] * c, inner, ctx.attrs().getFloat("epsilon", 1e-5f), ctx.stream(), c);
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
    launchReduce(t, ReduceOp::Mean, x.data, y.data, outer, outer ? x.numel() / outer : 0, 1, ctx.stream());
    return {y};
}

// softmax(Q Kt * scale + mask) V as two strided-batched tensor-core GEMMs (heads batched,
// one pair per batch entry) around a scaled masked softmax; the scores live in scratch memory.
void attentionByGemm(OpContext& ctx, DType t, const AttentionGeometry& g, const DeviceTensor& out, float scale, const void* mask, DType mt,
                     const View6& vm, const Shape6& score_shape) {
    const int64_t BH = g.batch * g.heads, S = g.S, T = g.T;
    const size_t score_bytes = static_cast<size_t>(BH * S * T) * sizeof(float);
    const size_t p_bytes = static_cast<size_t>(BH * S * T) * dtypeSize(t);
    char* scratch = static_cast<char*>(ctx.res.scratch(1, score_bytes + p_bytes + 256));
    float* scores = reinterpret_cast<float*>(scratch);
    char* p = scratch + ((score_bytes + 255) / 256) * 256;
    const float one = 1.f, zero = 0.f;
    const cublasComputeType_t compute = t == DType::F32 ? (ctx.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
    const cudaDataType_t ct = cudaTypeOf(t);
    const size_t es = dtypeSize(t);
    const char* q = static_cast<const char*>(ctx.input(0).data);
    const char* k = static_cast<const char*>(ctx.input(1).data);
    const char* v = static_cast<const char*>(ctx.input(2).data);
    // Column-major views: K is T x D (key-contiguous Kt) or D x T transposed (bshd rows).
    const bool k_rows = g.k_key != 1;
    const int ldk = static_cast<int>(k_rows ? g.k_key : g.k_dim);
    const int heads = static_cast<int>(g.heads);
    for (int64_t b = 0; b < g.batch; ++b) {
        const cublasStatus_t st = cublasGemmStridedBatchedEx(
            ctx.res.blas(), k_rows ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(T), static_cast<int>(S), static_cast<int>(g.D), &one,
            k + b * g.k_batch * es, ct, ldk, g.k_head, q + b * g.q_batch * es, ct, static_cast<int>(g.q_row), g.q_head, &zero,
            scores + b * g.heads * S * T, CUDA_R_32F, static_cast<int>(T), S * T, heads, compute, CUBLAS_GEMM_DEFAULT);
        ctx.require(st == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS attention scores: ") + cublasGetStatusString(st));
    }
    launchScaledMaskedSoftmax(t, scores, scale, mt, mask, vm, score_shape, p, ctx.stream());
    for (int64_t b = 0; b < g.batch; ++b) {
        const cublasStatus_t st = cublasGemmStridedBatchedEx(
            ctx.res.blas(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(g.E), static_cast<int>(S), static_cast<int>(T), &one, v + b * g.v_batch * es, ct,
            static_cast<int>(g.v_row), g.v_head, p + b * g.heads * S * T * es, ct, static_cast<int>(T), S * T, &zero,
            static_cast<char*>(out.data) + b * g.out_batch * es, ct, static_cast<int>(g.out_row), g.out_head, heads, compute, CUBLAS_GEMM_DEFAULT);
        ctx.require(st == CUBLAS_STATUS_SUCCESS, std::string("cuBLAS attention output: ") + cublasGetStatusString(st));
    }
}

// Attention(Q, Kt, V [, mask]) {scale, layout}: canonical operands, or with layout "bshd"
// Q [B,S,H,D], K [B,T,H,D], V [B,T,H,E] -> [B,S,H,E] (the transposes around it folded).
std::vector<DeviceTensor> attention(OpContext& ctx) {
    const DeviceTensor& q = ctx.input(0);
    const DeviceTensor& kt = ctx.input(1);
    const DeviceTensor& v = ctx.input(2);
    const DType t = ctx.floatType(0);
    if (kt.dtype != t || v.dtype != t) ctx.unsupported("mixed element types");
    const size_t rank = q.dims.size();
    if (rank < 2 || kt.dims.size() != rank || v.dims.size() != rank) ctx.unsupported("inputs of different ranks");
    const bool bshd = ctx.attrs().getString("layout", "") == "bshd";
    AttentionGeometry g;
    Dims score_dims, out_dims;
    if (bshd) {
        ctx.require(rank == 4, "layout bshd needs rank-4 q, k and v");
        const int64_t B = q.dims[0], S = q.dims[1], H = q.dims[2], D = q.dims[3], T = kt.dims[1], E = v.dims[3];
        ctx.require(kt.dims[0] == B && v.dims[0] == B && kt.dims[2] == H && v.dims[2] == H && kt.dims[3] == D && v.dims[1] == T,
                    "Q, K and V shapes do not chain (layout bshd)");
        g = attentionGeometry(true, B, H, S, T, D, E);
        score_dims = {B, H, S, T};
        out_dims = {B, S, H, E};
    } else {
        int64_t batch = 1;
        for (size_t d = 0; d + 2 < rank; ++d) {
            if (kt.dims[d] != q.dims[d] || v.dims[d] != q.dims[d]) ctx.unsupported("broadcast batch dims");
            batch *= q.dims[d];
        }
        const int64_t S = q.dims[rank - 2], D = q.dims[rank - 1], T = kt.dims[rank - 1], E = v.dims[rank - 1];
        ctx.require(kt.dims[rank - 2] == D && v.dims[rank - 2] == T, "Q, Kt and V shapes do not chain");
        g = attentionGeometry(false, 1, batch, S, T, D, E);
        score_dims.assign(q.dims.begin(), q.dims.end() - 1);
        score_dims.push_back(T);
        out_dims.assign(q.dims.begin(), q.dims.end() - 1);
        out_dims.push_back(E);
    }
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
    DeviceTensor out = ctx.output(0, q.logical, out_dims);
    const float scale = ctx.attrs().getFloat("scale", 1.0f);
    const bool fused_ok = g.D <= kFusedAttentionMaxHead && g.E <= kFusedAttentionMaxHead && g.batch * g.heads < 65536;
    const bool flash_ok = flashAttentionSupports(t, g);
    auto flash = [&] { launchFlashAttention(t, g, q.data, kt.data, v.data, mt, mask, vm, score_shape, out.data, scale, ctx.stream()); };
    auto fused = [&] { launchFusedAttention(t, g, q.data, kt.data, v.data, mt, mask, vm, score_shape, out.data, scale, ctx.stream()); };
    auto gemm = [&] { attentionByGemm(ctx, t, g, out, scale, mask, mt, vm, score_shape); };
    std::string choice = ctx.tactic;
    if (choice.empty()) {
        const std::string wanted = routeValue(ctx.route, "tactic.cuda.attention");
        if (wanted != "auto") {
            choice = wanted;
        } else if (ctx.calibrate) {  // the fastest of the kernels that take these operands
            float best = timeOnStream(ctx.stream(), gemm);
            choice = "gemm";
            if (fused_ok) {
                const float ms = timeOnStream(ctx.stream(), fused);
                if (ms < best) best = ms, choice = "fused";
            }
            if (flash_ok && timeOnStream(ctx.stream(), flash) < best) choice = "flash";
        } else if (flash_ok) {
            choice = "flash";
        } else {
            choice = fused_ok && g.batch * g.heads * g.S <= 8192 && g.T <= 2048 ? "fused" : "gemm";  // no timing: short sequences fuse
        }
    }
    // A forced kernel that cannot take these operands gives way to the next general one.
    if (choice == "flash" && !flash_ok) choice = fused_ok ? "fused" : "gemm";
    if (choice == "fused" && !fused_ok) choice = "gemm";
    ctx.chosen_tactic = choice;
    if (choice == "flash") flash();
    else if (choice == "fused") fused();
    else gemm();
    return {out};
}

}  // namespace

void addNnOps(std::map<std::string, OpFn>& ops) {
    ops["LayerNormalization"] = layerNorm;
    ops["InstanceNormalization"] = instanceNorm;
    ops["Softmax"] = softmax;
    ops["LogSoftmax"] = softmax;
    ops["MaxPool"] = pool;
    ops["AveragePool"] = pool;
    ops["GlobalAveragePool"] = globalAveragePool;
    ops["Attention"] = attention;
}

}  // namespace kiln::cuda
