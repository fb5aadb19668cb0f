// MatMul, Gemm and FusedMatMul through cuBLASLt. Row-major C = A B is computed as the
// column-major C^T = B^T A^T, so no operand is ever transposed in memory. A bias vector
// and ReLU / tanh-GELU run in cuBLASLt's epilogue; other activations and broadcast
// residuals in one epilogue kernel after it. The cuBLASLt algorithm is the node's tactic:
// "lt:<i>" picks the i-th heuristic result; auto times the top results at build time.
#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_op.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxAlgorithms = 8;
constexpr size_t kMaxWorkspace = 32u << 20;

#define KILN_LT_CHECK(call, ctx)                                                                                   \
    do {                                                                                                           \
        const cublasStatus_t kiln_lt_ = (call);                                                                    \
        (ctx).require(kiln_lt_ == CUBLAS_STATUS_SUCCESS, std::string("cuBLASLt ") + #call + ": " + cublasGetStatusString(kiln_lt_)); \
    } while (0)

// The problem one node solves, in row-major terms.
struct GemmShape {
    int64_t batch = 1, m = 0, n = 0, k = 0;
    int64_t stride_a = 0, stride_b = 0;  // batch strides (elements); 0 broadcasts
    bool trans_a = false, trans_b = false;
    Dims out;
};

struct LtPlan : NodeState {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
    int chosen = 0;
    ~LtPlan() override {
        if (desc) cublasLtMatmulDescDestroy(desc);
        for (auto l : {la, lb, lc})
            if (l) cublasLtMatrixLayoutDestroy(l);
    }
};

Dims batchDims(const Dims& d) { return d.size() > 2 ? Dims(d.begin(), d.end() - 2) : Dims{}; }

GemmShape matmulShape(const OpContext& ctx, const Dims& a_in, const Dims& b_in, bool trans_a, bool trans_b) {
    GemmShape g;
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    Dims a = a_in, b = b_in;
    const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
    if (a_vec) a.insert(a.begin(), 1);
    if (b_vec) b.push_back(1);
    if ((trans_a || trans_b) && (a.size() != 2 || b.size() != 2)) ctx.unsupported("transposed batched operands");
    g.k = trans_a ? a[a.size() - 2] : a.back();
    const int64_t kb = trans_b ? b.back() : b[b.size() - 2];
    ctx.require(g.k == kb, "inner dims differ: " + dimsToString(a_in) + " x " + dimsToString(b_in));
    g.n = trans_b ? b[b.size() - 2] : b.back();
    if (b.size() == 2) {  // shared weight: fold A's batch into M
        g.m = trans_a ? a.back() : (g.k ? numElements(a) / g.k : 0);
        if (a.size() > 2 && trans_a) ctx.unsupported("transposed batched A");
        g.out = Dims(a.begin(), a.end() - 1);
        if (trans_a) g.out = {g.m};
        g.out.push_back(g.n);
    } else {
        const Dims ba = batchDims(a), bb = batchDims(b);
        const Dims bo = broadcastDims(ba, bb, ctx.node.describe());
        const int64_t na = numElements(ba), nb = numElements(bb);
        if (!((ba == bo || na == 1) && (bb == bo || nb == 1))) ctx.unsupported("partially broadcast batch dims");
        g.m = a[a.size() - 2];
        g.batch = numElements(bo);
        g.stride_a = na == 1 ? 0 : g.m * g.k;
        g.stride_b = nb == 1 ? 0 : g.k * g.n;
        g.out = bo;
        g.out.push_back(g.m);
        g.out.push_back(g.n);
    }
    if (a_vec) g.out.erase(g.out.end() - 2);
    if (b_vec) g.out.pop_back();
    return g;
}

void setBatch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride, const OpContext& ctx) {
    if (batch == 1) return;
    const int32_t count = static_cast<int32_t>(batch);
    KILN_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), ctx);
    KILN_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), ctx);
}

// D = alpha * A B (+ beta * C) with the given cuBLASLt epilogue; bias may be null.
void runGemm(OpContext& ctx, DType t, const GemmShape& g, const void* a, const void* b, const void* c, float alpha, float beta, void* d,
             cublasLtEpilogue_t epilogue, const void* bias) {
    if (g.m == 0 || g.n == 0) return;
    auto& slot = *ctx.state;
    if (!slot) {
        auto plan = std::make_unique<LtPlan>();
        const cudaDataType_t ct = cudaTypeOf(t);
        const cublasComputeType_t compute = t == DType::F32 && ctx.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        KILN_LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F), ctx);
        // Column-major view: Lt's A is our B (N x K), Lt's B is our A (K x M).
        const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), ctx);
        KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), ctx);
        KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), ctx);
        if (bias) {
            const cudaDataType_t bt = ct;
            KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), ctx);
        }
        KILN_LT_CHECK(g.trans_b ? cublasLtMatrixLayoutCreate(&plan->la, ct, g.k, g.n, g.k) : cublasLtMatrixLayoutCreate(&plan->la, ct, g.n, g.k, g.n), ctx);
        KILN_LT_CHECK(g.trans_a ? cublasLtMatrixLayoutCreate(&plan->lb, ct, g.m, g.k, g.m) : cublasLtMatrixLayoutCreate(&plan->lb, ct, g.k, g.m, g.k), ctx);
        KILN_LT_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, ct, g.n, g.m, g.n), ctx);
        setBatch(plan->la, g.batch, g.stride_b, ctx);
        setBatch(plan->lb, g.batch, g.stride_a, ctx);
        setBatch(plan->lc, g.batch, g.m * g.n, ctx);
        cublasLtMatmulPreference_t pref;
        KILN_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), ctx);
        const size_t ws = kMaxWorkspace;
        KILN_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), ctx);
        plan->algos.resize(kMaxAlgorithms);
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.res.lt(), plan->desc, plan->la, plan->lb, plan->lc, plan->lc, pref,
                                                                 kMaxAlgorithms, plan->algos.data(), &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) ctx.unsupported("no cuBLASLt algorithm for this problem");
        plan->algos.resize(found);
        slot = std::move(plan);
    }
    auto& plan = static_cast<LtPlan&>(*slot);
    if (bias) KILN_LT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), ctx);
    size_t ws = 0;
    for (const auto& r : plan.algos) ws = std::max(ws, r.workspaceSize);
    void* workspace = ctx.res.scratch(0, ws);
    auto launch = [&](int i) {
        KILN_LT_CHECK(cublasLtMatmul(ctx.res.lt(), plan.desc, &alpha, b, plan.la, a, plan.lb, &beta, c ? c : d, plan.lc, d, plan.lc,
                                     &plan.algos[i].algo, workspace, plan.algos[i].workspaceSize, ctx.stream()),
                      ctx);
    };
    if (!ctx.tactic.empty() && ctx.tactic.rfind("lt:", 0) == 0) {
        plan.chosen = std::clamp(std::atoi(ctx.tactic.c_str() + 3), 0, static_cast<int>(plan.algos.size()) - 1);
    } else if (ctx.calibrate && routeValue(ctx.route, "tactic.cuda.gemm") == "auto" && plan.algos.size() > 1) {
        float best = INFINITY;
        for (int i = 0; i < static_cast<int>(plan.algos.size()); ++i) {
            const float ms = timeOnStream(ctx.stream(), [&] { launch(i); });
            if (ms < best) best = ms, plan.chosen = i;
        }
    }
    ctx.chosen_tactic = "lt:" + std::to_string(plan.chosen);
    launch(plan.chosen);
}

bool isBiasVector(const Dims& z, int64_t n) {
    if (z.empty() || z.back() != n) return false;
    for (size_t d = 0; d + 1 < z.size(); ++d)
        if (z[d] != 1) return false;
    return true;
}

// FusedMatMul(A, B, Z [, R]) = act(A B + Z + R) and plain MatMul. Z is a bias vector or a
// tensor; R, a residual, goes in as cuBLASLt's C (beta 1) when it needs no broadcast.
std::vector<DeviceTensor> matmul(OpContext& ctx) {
    const DeviceTensor& a = ctx.input(0);
    const DeviceTensor& b = ctx.input(1);
    const DType t = ctx.floatType(0);
    if (b.dtype != t) ctx.unsupported("mixed element types");
    const bool fused = ctx.node.op_type == "FusedMatMul";
    const GemmShape g = matmulShape(ctx, a.dims, b.dims, false, fused && ctx.attrs().getInt("trans_b", 0) != 0);
    const UnaryFn act = fused ? fusedActivation(ctx) : UnaryFn{};
    const DeviceTensor* z = fused && ctx.has(2) ? &ctx.input(2) : nullptr;
    const DeviceTensor* r = fused && ctx.has(3) ? &ctx.input(3) : nullptr;
    if ((z && z->dtype != t) || (r && r->dtype != t)) ctx.unsupported("residual type");
    DeviceTensor y = ctx.output(0, a.logical, g.out);
    const bool bias = z && isBiasVector(z->dims, g.n);
    const bool full = z && z->dims == g.out && g.batch == 1;
    const bool lt_act = act.op == UnaryOp::Relu || act.op == UnaryOp::GeluTanh || act.op == UnaryOp::Identity;
    if (r) {
        const bool r_full = r->dims == g.out && g.batch == 1;
        if (r_full && act.op == UnaryOp::Identity && (!z || bias)) {
            runGemm(ctx, t, g, a.data, b.data, r->data, 1.f, 1.f, y.data, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias ? z->data : nullptr);
        } else {
            runGemm(ctx, t, g, a.data, b.data, nullptr, 1.f, 0.f, y.data, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias ? z->data : nullptr);
            const bool z_left = z && !bias;
            launchEpilogue(t, y.data, toShape6(g.out, ctx), z_left ? z->data : nullptr, z_left ? broadcastView(z->dims, g.out, ctx) : View6{}, act,
                           ctx.stream(), r->data, broadcastView(r->dims, g.out, ctx));
        }
        return {y};
    }
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
    if (lt_act && (bias || !z || full)) {
        if (act.op == UnaryOp::Relu) ep = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
        else if (act.op == UnaryOp::GeluTanh) ep = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
        else if (bias) ep = CUBLASLT_EPILOGUE_BIAS;
        runGemm(ctx, t, g, a.data, b.data, full ? z->data : nullptr, 1.f, full ? 1.f : 0.f, y.data, ep, bias ? z->data : nullptr);
    } else if (bias && !full) {
        runGemm(ctx, t, g, a.data, b.data, nullptr, 1.f, 0.f, y.data, CUBLASLT_EPILOGUE_BIAS, z->data);
        launchEpilogue(t, y.data, toShape6(g.out, ctx), nullptr, View6{}, act, ctx.stream());
    } else {
        runGemm(ctx, t, g, a.data, b.data, nullptr, 1.f, 0.f, y.data, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
        launchEpilogue(t, y.data, toShape6(g.out, ctx), z ? z->data : nullptr, z ? broadcastView(z->dims, g.out, ctx) : View6{}, act, ctx.stream());
    }
    return {y};
}

// Gemm(A, B, C) = alpha op(A) op(B) + beta C.
std::vector<DeviceTensor> gemm(OpContext& ctx) {
    const DeviceTensor& a = ctx.input(0);
    const DeviceTensor& b = ctx.input(1);
    const DType t = ctx.floatType(0);
    if (b.dtype != t || a.dims.size() != 2 || b.dims.size() != 2) ctx.unsupported("operands");
    const GemmShape g = matmulShape(ctx, a.dims, b.dims, ctx.attrs().getInt("transA", 0) != 0, ctx.attrs().getInt("transB", 0) != 0);
    const float alpha = ctx.attrs().getFloat("alpha", 1.f), beta = ctx.attrs().getFloat("beta", 1.f);
    DeviceTensor y = ctx.output(0, a.logical, g.out);
    const DeviceTensor* c = ctx.has(2) ? &ctx.input(2) : nullptr;
    if (c && c->dtype != t) ctx.unsupported("C type");
    if (!c || beta == 0.f) {
        runGemm(ctx, t, g, a.data, b.data, nullptr, alpha, 0.f, y.data, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
    } else if (c->dims == g.out) {
        runGemm(ctx, t, g, a.data, b.data, c->data, alpha, beta, y.data, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
    } else if (beta == 1.f && isBiasVector(c->dims, g.n)) {
        runGemm(ctx, t, g, a.data, b.data, nullptr, alpha, 0.f, y.data, CUBLASLT_EPILOGUE_BIAS, c->data);
    } else if (beta == 1.f) {
        runGemm(ctx, t, g, a.data, b.data, nullptr, alpha, 0.f, y.data, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
        launchEpilogue(t, y.data, toShape6(g.out, ctx), c->data, broadcastView(c->dims, g.out, ctx), UnaryFn{}, ctx.stream());
    } else {
        ctx.unsupported("broadcast C with beta != 1");
    }
    return {y};
}

}  // namespace

void addGemmOps(std::map<std::string, OpFn>& ops) {
    ops["MatMul"] = matmul;
    ops["FusedMatMul"] = matmul;
    ops["Gemm"] = gemm;
}

}  // namespace kiln::cuda
