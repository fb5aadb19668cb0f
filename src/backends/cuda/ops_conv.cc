// Conv and FusedConv through cuDNN (NCHW, or NHWC for nodes the layout pass marked),
// followed by one epilogue kernel for bias, residual and activation. The cuDNN forward
// algorithm is the node's tactic ("cudnn:<algo>"): auto times cuDNN's heuristic and search
// proposals at build time, heuristic takes cuDNN's first suggestion.
#include <algorithm>

#include "backends/cpu/reference/kernel_util.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

#define KILN_DNN_CHECK(call, ctx)                                                                                          \
    do {                                                                                                                   \
        const cudnnStatus_t kiln_dnn_ = (call);                                                                            \
        (ctx).require(kiln_dnn_ == CUDNN_STATUS_SUCCESS, std::string("cuDNN ") + #call + ": " + cudnnGetErrorString(kiln_dnn_)); \
    } while (0)

cudnnDataType_t dnnTypeOf(DType t) { return t == DType::F16 ? CUDNN_DATA_HALF : (t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT); }

struct ConvPlan : NodeState {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t workspace = 0;
    void* weight_khwc = nullptr;  // weights in the NHWC filter layout (owned)
    ~ConvPlan() override {
        if (x) cudnnDestroyTensorDescriptor(x);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
        if (weight_khwc) cudaFree(weight_khwc);
    }
};

struct ConvGeometry {
    int64_t n, c, h, w, k, r, s, oh, ow, groups;
    int pads[2], strides[2], dilations[2];
};

ConvGeometry geometry(const OpContext& ctx, const Dims& x4, const Dims& w4, bool nhwc) {
    ConvGeometry g{};
    g.n = x4[0];
    g.c = nhwc ? x4[3] : x4[1];
    g.h = nhwc ? x4[1] : x4[2];
    g.w = nhwc ? x4[2] : x4[3];
    g.k = w4[0];
    g.r = w4[2];
    g.s = w4[3];
    g.groups = ctx.attrs().getInt("group", 1);
    ctx.require(g.groups > 0 && g.c == w4[1] * g.groups && g.k % g.groups == 0, "channels do not match the weights and groups");
    const Dims spatial{g.h, g.w};
    const std::vector<int64_t> kernel{g.r, g.s};
    auto strides = ctx.attrs().getInts("strides", Dims(2, 1));
    auto dilations = ctx.attrs().getInts("dilations", Dims(2, 1));
    if (strides.size() == 1) strides.insert(strides.begin(), 1);
    if (dilations.size() == 1) dilations.insert(dilations.begin(), 1);
    KernelContext attrs{ctx.node, {}, ctx.opset, nullptr};
    SpatialPads pads{{0, 0}, {0, 0}};
    if (ctx.attrs().getInts("kernel_shape", {0, 0}).size() == 1 || w4.size() == 3) ctx.unsupported("1-D convolution");
    pads = resolvePads(attrs, spatial, kernel, strides, dilations);
    for (int i = 0; i < 2; ++i) {
        if (pads.begin[i] != pads.end[i]) ctx.unsupported("asymmetric padding");
        g.pads[i] = static_cast<int>(pads.begin[i]);
        g.strides[i] = static_cast<int>(strides[i]);
        g.dilations[i] = static_cast<int>(dilations[i]);
    }
    g.oh = (g.h + 2 * g.pads[0] - ((g.r - 1) * g.dilations[0] + 1)) / g.strides[0] + 1;
    g.ow = (g.w + 2 * g.pads[1] - ((g.s - 1) * g.dilations[1] + 1)) / g.strides[1] + 1;
    ctx.require(g.oh > 0 && g.ow > 0, "kernel larger than the padded input");
    return g;
}

void makePlan(OpContext& ctx, ConvPlan& p, DType t, const ConvGeometry& g, bool nhwc, const DeviceTensor& weights) {
    const cudnnDataType_t dt = dnnTypeOf(t);
    const cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&p.x), ctx);
    KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&p.y), ctx);
    KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&p.w), ctx);
    KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv), ctx);
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(p.x, fmt, dt, g.n, g.c, g.h, g.w), ctx);
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(p.y, fmt, dt, g.n, g.k, g.oh, g.ow), ctx);
    KILN_DNN_CHECK(cudnnSetFilter4dDescriptor(p.w, dt, fmt, g.k, g.c / g.groups, g.r, g.s), ctx);
    KILN_DNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv, g.pads[0], g.pads[1], g.strides[0], g.strides[1], g.dilations[0], g.dilations[1],
                                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   ctx);
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(p.conv, static_cast<int>(g.groups)), ctx);
    const cudnnMathType_t math = t != DType::F32 ? CUDNN_TENSOR_OP_MATH : (ctx.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(p.conv, math), ctx);
    if (nhwc) {  // OIHW -> OHWI, once
        const Dims oihw = weights.dims, ohwi{oihw[0], oihw[2], oihw[3], oihw[1]};
        KILN_CUDA_CHECK(cudaMalloc(&p.weight_khwc, weights.bytes()));
        View6 src;
        const int64_t so = oihw[1] * oihw[2] * oihw[3], si = oihw[2] * oihw[3], sh = oihw[3];
        src.strides[0] = so, src.strides[1] = sh, src.strides[2] = 1, src.strides[3] = si;
        launchStridedCopy(dtypeSize(t), weights.data, src, p.weight_khwc, denseView(ohwi), toShape6(ohwi, ctx), ctx.stream());
    }
}

// Successful algorithms of a cuDNN result list, in its order, at most `limit`.
void appendAlgorithms(const cudnnConvolutionFwdAlgoPerf_t* perf, int found, size_t limit, std::vector<cudnnConvolutionFwdAlgo_t>& out) {
    size_t taken = 0;
    for (int i = 0; i < found && taken < limit; ++i) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
        ++taken;
        if (std::find(out.begin(), out.end(), perf[i].algo) == out.end()) out.push_back(perf[i].algo);
    }
}

constexpr size_t kMaxConvWorkspace = 256u << 20;  // cuDNN workspace an algorithm may ask for

bool workspaceOf(OpContext& ctx, const ConvPlan& p, cudnnConvolutionFwdAlgo_t a, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(ctx.res.dnn(), p.x, p.w, p.conv, p.y, a, bytes) == CUDNN_STATUS_SUCCESS;
}

// The heuristic's first proposal that runs, then any other algorithm that does, so that a
// convolution cuDNN refuses for one algorithm takes another, and one no algorithm runs goes
// to the host with the reasons instead of failing the run. Each is tried once, into y, when
// the plan is made (never during a graph capture: plans are made in the first, recorded run).
cudnnConvolutionFwdAlgo_t firstThatRuns(OpContext& ctx, const ConvPlan& p, const void* x, const void* w, void* y, const cudnnConvolutionFwdAlgoPerf_t* perf,
                                        int found) {
    std::vector<cudnnConvolutionFwdAlgo_t> order;
    appendAlgorithms(perf, found, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, order);
    for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a)
        if (std::find(order.begin(), order.end(), static_cast<cudnnConvolutionFwdAlgo_t>(a)) == order.end())
            order.push_back(static_cast<cudnnConvolutionFwdAlgo_t>(a));
    std::string refused;
    const float one = 1.f, zero = 0.f;
    for (auto a : order) {
        size_t bytes = 0;
        if (!workspaceOf(ctx, p, a, &bytes) || bytes > kMaxConvWorkspace) continue;
        const cudnnStatus_t status =
            cudnnConvolutionForward(ctx.res.dnn(), &one, p.x, x, p.w, w, p.conv, a, ctx.res.scratch(0, bytes), bytes, &zero, p.y, y);
        if (status == CUDNN_STATUS_SUCCESS) return a;
        refused += (refused.empty() ? "" : ", ") + std::to_string(static_cast<int>(a)) + " (" + cudnnGetErrorString(status) + ")";
    }
    ctx.unsupported("no cuDNN algorithm runs this convolution" + (refused.empty() ? std::string() : ": refused " + refused));
}

void chooseAlgorithm(OpContext& ctx, ConvPlan& p, const void* x, const void* w, void* y) {
    if (!ctx.tactic.empty() && ctx.tactic.rfind("cudnn:", 0) == 0) {
        p.algo = static_cast<cudnnConvolutionFwdAlgo_t>(std::atoi(ctx.tactic.c_str() + 6));
    } else {
        constexpr int kRequested = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
        cudnnConvolutionFwdAlgoPerf_t perf[kRequested];
        int found = 0;
        std::vector<cudnnConvolutionFwdAlgo_t> candidates;
        KILN_DNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(ctx.res.dnn(), p.x, p.w, p.conv, p.y, kRequested, &found, perf), ctx);
        // The route decides whether to search, not how many proposals the heuristic made (a
        // single proposal still gets cuDNN's search and the timing below).
        const bool search = ctx.calibrate && routeValue(ctx.route, "tactic.cuda.conv") == "auto";
        if (search) {
            appendAlgorithms(perf, found, 3, candidates);
            // auto: cuDNN's own timed search proposes more, then every candidate is timed here, as
            // it will run (this stream, this workspace, the plan's math type); cuDNN's search alone
            // picked algorithms that ran slower than its heuristic inside the whole network.
            void* scratch = ctx.res.scratch(0, kMaxConvWorkspace);
            KILN_DNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(ctx.res.dnn(), p.x, x, p.w, w, p.conv, p.y, y, kRequested, &found, perf, scratch,
                                                                  kMaxConvWorkspace),
                           ctx);
            appendAlgorithms(perf, found, 3, candidates);
            float best_ms = 0;
            const float one = 1.f, zero = 0.f;
            for (auto a : candidates) {
                size_t bytes = 0;
                if (!workspaceOf(ctx, p, a, &bytes) || bytes > kMaxConvWorkspace) continue;
                bool ok = true;
                const float ms = timeOnStream(ctx.stream(), [&] {
                    ok = ok && cudnnConvolutionForward(ctx.res.dnn(), &one, p.x, x, p.w, w, p.conv, a, scratch, bytes, &zero, p.y, y) == CUDNN_STATUS_SUCCESS;
                });
                if (ok && (best_ms == 0 || ms < best_ms)) best_ms = ms, p.algo = a;
            }
            if (best_ms == 0) p.algo = firstThatRuns(ctx, p, x, w, y, perf, found);
        } else {
            p.algo = firstThatRuns(ctx, p, x, w, y, perf, found);
        }
    }
    ctx.require(workspaceOf(ctx, p, p.algo, &p.workspace), "cuDNN algorithm " + std::to_string(static_cast<int>(p.algo)) + " does not fit this convolution");
    ctx.chosen_tactic = "cudnn:" + std::to_string(static_cast<int>(p.algo));
}

std::vector<DeviceTensor> conv(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DeviceTensor& w = ctx.input(1);
    const DType t = ctx.floatType(0);
    if (w.dtype != t) ctx.unsupported("mixed element types");
    if (x.dims.size() != 4 || w.dims.size() != 4) ctx.unsupported("convolution of rank " + std::to_string(x.dims.size()));
    const bool nhwc = ctx.attrs().getString("data_layout", "NCHW") == "NHWC";
    const ConvGeometry g = geometry(ctx, x.dims, w.dims, nhwc);
    const Dims out_dims = nhwc ? Dims{g.n, g.oh, g.ow, g.k} : Dims{g.n, g.k, g.oh, g.ow};
    const DeviceTensor* bias = ctx.has(2) ? &ctx.input(2) : nullptr;
    const DeviceTensor* z = ctx.node.op_type == "FusedConv" && ctx.has(3) ? &ctx.input(3) : nullptr;
    if ((bias && (bias->dtype != t || bias->numel() != g.k)) || (z && z->dtype != t)) ctx.unsupported("bias/residual");
    const UnaryFn act = ctx.node.op_type == "FusedConv" ? fusedActivation(ctx) : UnaryFn{};
    DeviceTensor y = ctx.output(0, x.logical, out_dims);
    auto& slot = *ctx.state;
    if (!slot) {
        auto plan = std::make_unique<ConvPlan>();
        makePlan(ctx, *plan, t, g, nhwc, w);
        chooseAlgorithm(ctx, *plan, x.data, nhwc ? plan->weight_khwc : w.data, y.data);
        slot = std::move(plan);
    }
    auto& p = static_cast<ConvPlan&>(*slot);
    ctx.chosen_tactic = "cudnn:" + std::to_string(static_cast<int>(p.algo));
    void* ws = ctx.res.scratch(0, p.workspace);
    const float one = 1.f, zero = 0.f;
    KILN_DNN_CHECK(cudnnConvolutionForward(ctx.res.dnn(), &one, p.x, x.data, p.w, nhwc ? p.weight_khwc : w.data, p.conv, p.algo, ws, p.workspace,
                                           &zero, p.y, y.data),
                   ctx);
    View6 vb;
    if (bias) vb.strides[nhwc ? 3 : 1] = 1;
    launchEpilogue(t, y.data, toShape6(out_dims, ctx), bias ? bias->data : nullptr, vb, act, ctx.stream(), z ? z->data : nullptr,
                   z ? broadcastView(z->dims, out_dims, ctx) : View6{});
    return {y};
}

// ConvTranspose as cuDNN's backward-data convolution: the ONNX weights [C_in, C_out / group,
// kh, kw] are the filter of the forward conv from C_out to C_in as they are. cuDNN pads both
// sides alike, so an asymmetric crop (pads, output_padding, output_shape, SAME_*) computes
// with the smaller pad and copies the window out; the bias goes through the epilogue.
struct DeconvPlan : NodeState {
    cudnnTensorDescriptor_t dy = nullptr, dx = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionBwdDataAlgo_t algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    size_t workspace = 0;
    Dims x_dims, full_dims, out_dims;  // full: what cuDNN writes, before the crop
    int64_t crop[2] = {0, 0};
    ~DeconvPlan() override {
        if (dy) cudnnDestroyTensorDescriptor(dy);
        if (dx) cudnnDestroyTensorDescriptor(dx);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
    }
};

void makeDeconvPlan(OpContext& ctx, DeconvPlan& p, DType t, const DeviceTensor& x, const DeviceTensor& w) {
    KernelContext attrs{ctx.node, {}, ctx.opset, nullptr};
    const DeconvGeometry g = deconvGeometry(attrs, x.dims, w.dims);
    int pads[2], strides[2], dilations[2];
    p.x_dims = x.dims;
    p.out_dims = {x.dims[0], g.M, g.out_spatial[0], g.out_spatial[1]};
    p.full_dims = p.out_dims;
    for (int i = 0; i < 2; ++i) {
        const int64_t pad = std::min(g.pad_begin[i], g.pad_end[i]);
        if (pad < 0) ctx.unsupported("an output larger than the full transposed convolution");
        pads[i] = static_cast<int>(pad), strides[i] = static_cast<int>(g.strides[i]), dilations[i] = static_cast<int>(g.dilations[i]);
        p.full_dims[2 + i] = g.out_spatial[i] + (g.pad_begin[i] - pad) + (g.pad_end[i] - pad);
        p.crop[i] = g.pad_begin[i] - pad;
    }
    const cudnnDataType_t dt = dnnTypeOf(t);
    KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&p.dy), ctx);
    KILN_DNN_CHECK(cudnnCreateTensorDescriptor(&p.dx), ctx);
    KILN_DNN_CHECK(cudnnCreateFilterDescriptor(&p.w), ctx);
    KILN_DNN_CHECK(cudnnCreateConvolutionDescriptor(&p.conv), ctx);
    const Dims& f = p.full_dims;
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(p.dy, CUDNN_TENSOR_NCHW, dt, x.dims[0], x.dims[1], x.dims[2], x.dims[3]), ctx);
    KILN_DNN_CHECK(cudnnSetTensor4dDescriptor(p.dx, CUDNN_TENSOR_NCHW, dt, f[0], f[1], f[2], f[3]), ctx);
    KILN_DNN_CHECK(cudnnSetFilter4dDescriptor(p.w, dt, CUDNN_TENSOR_NCHW, w.dims[0], w.dims[1], w.dims[2], w.dims[3]), ctx);
    KILN_DNN_CHECK(cudnnSetConvolution2dDescriptor(p.conv, pads[0], pads[1], strides[0], strides[1], dilations[0], dilations[1], CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT),
                   ctx);
    KILN_DNN_CHECK(cudnnSetConvolutionGroupCount(p.conv, static_cast<int>(g.group)), ctx);
    const cudnnMathType_t math = t != DType::F32 ? CUDNN_TENSOR_OP_MATH : (ctx.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
    KILN_DNN_CHECK(cudnnSetConvolutionMathType(p.conv, math), ctx);
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int found = 0;
    KILN_DNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx.res.dnn(), p.w, p.dy, p.conv, p.dx, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &found, perf), ctx);
    bool chosen = false;
    for (int i = 0; i < found && !chosen; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS) p.algo = perf[i].algo, chosen = true;
    if (!chosen) ctx.unsupported("no cuDNN algorithm");
    KILN_DNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(ctx.res.dnn(), p.w, p.dy, p.conv, p.dx, p.algo, &p.workspace), ctx);
}

std::vector<DeviceTensor> convTranspose(OpContext& ctx) {
    const DeviceTensor& x = ctx.input(0);
    const DeviceTensor& w = ctx.input(1);
    const DType t = ctx.floatType(0);
    if (w.dtype != t) ctx.unsupported("mixed element types");
    if (x.dims.size() != 4 || w.dims.size() != 4) ctx.unsupported("transposed convolution of rank " + std::to_string(x.dims.size()));
    const DeviceTensor* bias = ctx.has(2) ? &ctx.input(2) : nullptr;
    auto& slot = *ctx.state;
    if (!slot || static_cast<DeconvPlan&>(*slot).x_dims != x.dims) {
        auto plan = std::make_unique<DeconvPlan>();
        makeDeconvPlan(ctx, *plan, t, x, w);
        slot = std::move(plan);
    }
    auto& p = static_cast<DeconvPlan&>(*slot);
    if (bias && (bias->dtype != t || bias->numel() != p.out_dims[1])) ctx.unsupported("bias");
    ctx.chosen_tactic = "cudnn_bwd_data:" + std::to_string(static_cast<int>(p.algo));
    const bool cropped = p.full_dims != p.out_dims;
    DeviceTensor y = ctx.output(0, x.logical, p.out_dims);
    void* full = cropped ? ctx.res.scratch(1, static_cast<size_t>(numElements(p.full_dims)) * dtypeSize(t)) : y.data;
    void* ws = ctx.res.scratch(0, p.workspace);
    const float one = 1.f, zero = 0.f;
    KILN_DNN_CHECK(cudnnConvolutionBackwardData(ctx.res.dnn(), &one, p.w, w.data, p.dy, x.data, p.conv, p.algo, ws, p.workspace, &zero, p.dx, full), ctx);
    if (cropped) {
        View6 src = denseView(p.full_dims);  // the full output's strides over the cropped window
        src.dense = false;
        src.offset = p.crop[0] * p.full_dims[3] + p.crop[1];
        launchStridedCopy(dtypeSize(t), full, src, y.data, denseView(p.out_dims), toShape6(p.out_dims, ctx), ctx.stream());
    }
    if (bias) {
        View6 vb;
        vb.strides[1] = 1;
        launchEpilogue(t, y.data, toShape6(p.out_dims, ctx), bias->data, vb, UnaryFn{}, ctx.stream(), nullptr, View6{});
    }
    return {y};
}

}  // namespace

void addConvOps(std::map<std::string, OpFn>& ops) {
    ops["Conv"] = conv;
    ops["FusedConv"] = conv;
    ops["ConvTranspose"] = convTranspose;
}

}  // namespace kiln::cuda
