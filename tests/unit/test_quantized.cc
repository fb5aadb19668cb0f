// Quantized models on the CPU: the qdq_fusion pass (QDQ around Conv/MatMul -> QLinearConv /
// QLinearMatMul), oneDNN's int8 kernels against the ONNX reference kernels, and the fast
// per-tensor QuantizeLinear/DequantizeLinear against theirs (bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/fast/tactics.h"
#include "pass_test_helpers.h"
#include "passes/pass.h"
#include "quant/calibration.h"

namespace kiln::testing {
namespace {

template <typename T>
Tensor randomInts(const Dims& dims, std::mt19937& rng, int lo, int hi) {
    Tensor t(DTypeOf<T>::value, dims);
    std::uniform_int_distribution<int> d(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(d(rng));
    return t;
}

Tensor randomScales(int64_t n, std::mt19937& rng, float lo, float hi) {
    return n == 0 ? Tensor::scalar<float>(std::uniform_real_distribution<float>(lo, hi)(rng)) : randomTensor({n}, rng, lo, hi);
}

const Tactic& tactic(const std::string& name, const std::string& op) {
    for (const auto& t : fastTactics())
        if (t.name == name && std::find(t.ops.begin(), t.ops.end(), op) != t.ops.end()) return t;
    throw Error("no tactic " + name + " for " + op);
}

// A node's inputs as the graph's constants, so that the tactic's build-time check sees them.
Graph constantsOf(const Node& n, const std::vector<Tensor>& inputs, size_t first_constant) {
    Graph g;
    g.opset = 21;
    for (size_t i = first_constant; i < inputs.size(); ++i)
        if (inputs[i].defined()) g.initializers[n.inputs[i]] = inputs[i];
    return g;
}

// Integer outputs within one step of the reference, and off by one on few elements (where
// the f32 requantization rounds a near-tie the other way than the reference's f64).
void expectWithinOneStep(const Tensor& got, const Tensor& want, const std::string& what) {
    ASSERT_EQ(got.dims(), want.dims()) << what;
    ASSERT_EQ(got.dtype(), want.dtype()) << what;
    int64_t off = 0, worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
        const auto d = static_cast<int64_t>(std::llround(std::fabs(got.scalarAt(i) - want.scalarAt(i))));
        off += d != 0, worst = std::max(worst, d);
    }
    EXPECT_LE(worst, 1) << what;
    EXPECT_LE(off, got.numel() / 100 + 1) << what << ": " << off << " of " << got.numel() << " elements differ";
}

struct QConvCase {
    Dims x;  // N, C, H, W
    int64_t out, k, stride, pad, dilation, group;
    bool per_channel, bias, signed_x;
    int x_zp, y_zp;
};

TEST(QuantizedDnnl, QLinearConvMatchesTheReference) {
    std::mt19937 rng(31);
    const std::vector<QConvCase> cases = {
        {{1, 16, 12, 12}, 32, 3, 1, 1, 1, 1, true, true, false, 128, 0},   // ResNet-like, ORT's u8 activations
        {{2, 8, 9, 11}, 16, 3, 2, 1, 1, 1, false, true, false, 7, 121},    // strided, per tensor, odd planes
        {{1, 24, 10, 10}, 24, 3, 1, 1, 1, 24, true, true, false, 100, 3},  // depthwise
        {{1, 16, 8, 8}, 32, 1, 1, 0, 1, 1, true, false, true, -5, 10},     // pointwise, s8 activations, no bias
        {{1, 12, 14, 14}, 12, 3, 1, 2, 2, 2, true, true, false, 0, 0},     // dilated, grouped
    };
    for (const auto& c : cases) {
        const int64_t C = c.x[1], kin = C / c.group;
        Node n{"qconv", "QLinearConv", "", {"x", "xs", "xz", "w", "ws", "wz", "ys", "yz"}, {"y"}, {}};
        n.attrs.set("kernel_shape", std::vector<int64_t>{c.k, c.k});
        n.attrs.set("strides", std::vector<int64_t>{c.stride, c.stride});
        n.attrs.set("pads", std::vector<int64_t>{c.pad, c.pad, c.pad, c.pad});
        n.attrs.set("dilations", std::vector<int64_t>{c.dilation, c.dilation});
        n.attrs.set("group", c.group);
        const float xs = 0.02f, ws_mean = 0.01f;
        // y's scale puts typical outputs some 40 steps from the zero point.
        const float ys = xs * ws_mean * std::sqrt(static_cast<float>(kin * c.k * c.k)) * 74.f * 73.f / 40.f;
        std::vector<Tensor> in = {c.signed_x ? randomInts<int8_t>(c.x, rng, -128, 127) : randomInts<uint8_t>(c.x, rng, 0, 255),
                                  Tensor::scalar<float>(xs),
                                  c.signed_x ? Tensor::scalar<int8_t>(static_cast<int8_t>(c.x_zp)) : Tensor::scalar<uint8_t>(static_cast<uint8_t>(c.x_zp)),
                                  randomInts<int8_t>({c.out, kin, c.k, c.k}, rng, -127, 127),
                                  randomScales(c.per_channel ? c.out : 0, rng, 0.5f * ws_mean, 1.5f * ws_mean),
                                  c.per_channel ? Tensor(DType::I8, {c.out}) : Tensor::scalar<int8_t>(0),
                                  Tensor::scalar<float>(ys),
                                  Tensor::scalar<uint8_t>(static_cast<uint8_t>(c.y_zp))};
        if (c.bias) {
            n.inputs.push_back("b");
            in.push_back(randomInts<int32_t>({c.out}, rng, -20000, 20000));
        }
        const std::string what = "x " + dimsToString(c.x) + " k" + std::to_string(c.k) + " group " + std::to_string(c.group);
        const Tactic& dnnl = tactic("dnnl", "QLinearConv");
        ASSERT_TRUE(dnnl.supports(n, constantsOf(n, in, 1))) << what;
        std::vector<const Tensor*> ptrs;
        for (const auto& t : in) ptrs.push_back(&t);
        const KernelContext ctx{n, ptrs, 21, nullptr};
        expectWithinOneStep(dnnl.kernel(ctx)[0], referenceKernels().find("QLinearConv")(ctx)[0], what);
    }
}

TEST(QuantizedDnnl, QLinearMatMulMatchesTheReference) {
    std::mt19937 rng(32);
    for (const bool per_column : {true, false}) {
        const Dims a_dims = per_column ? Dims{2, 7, 64} : Dims{5, 48};
        const int64_t K = a_dims.back(), N = 24;
        Node n{"qmm", "QLinearMatMul", "", {"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, {"y"}, {}};
        const float ys = 0.02f * 0.01f * std::sqrt(static_cast<float>(K)) * 74.f * 73.f / 40.f;
        std::vector<Tensor> in = {randomInts<uint8_t>(a_dims, rng, 0, 255), Tensor::scalar<float>(0.02f), Tensor::scalar<uint8_t>(131),
                                  randomInts<int8_t>({K, N}, rng, -127, 127), randomScales(per_column ? N : 0, rng, 0.005f, 0.015f),
                                  per_column ? Tensor(DType::I8, {N}) : Tensor::scalar<int8_t>(0), Tensor::scalar<float>(ys),
                                  Tensor::scalar<int8_t>(-4)};
        const Tactic& dnnl = tactic("dnnl", "QLinearMatMul");
        ASSERT_TRUE(dnnl.supports(n, constantsOf(n, in, 1)));
        std::vector<const Tensor*> ptrs;
        for (const auto& t : in) ptrs.push_back(&t);
        const KernelContext ctx{n, ptrs, 21, nullptr};
        expectWithinOneStep(dnnl.kernel(ctx)[0], referenceKernels().find("QLinearMatMul")(ctx)[0], per_column ? "per column" : "per tensor");
    }
}

TEST(QuantizedDnnl, AsymmetricWeightsAreNotTaken) {
    std::mt19937 rng(33);
    Node n{"qmm", "QLinearMatMul", "", {"a", "as", "az", "b", "bs", "bz", "ys", "yz"}, {"y"}, {}};
    std::vector<Tensor> in = {randomInts<uint8_t>({4, 8}, rng, 0, 255), Tensor::scalar<float>(0.02f), Tensor::scalar<uint8_t>(128),
                              randomInts<int8_t>({8, 4}, rng, -127, 127), Tensor::scalar<float>(0.01f), Tensor::scalar<int8_t>(3),
                              Tensor::scalar<float>(0.1f), Tensor::scalar<uint8_t>(128)};
    EXPECT_FALSE(tactic("dnnl", "QLinearMatMul").supports(n, constantsOf(n, in, 1)));
}

TEST(QuantizeFast, PerTensorQuantizeAndDequantizeMatchTheReferenceExactly) {
    std::mt19937 rng(34);
    for (const DType t : {DType::U8, DType::I8}) {
        const float scale = 0.037f;
        Tensor x = randomTensor({3, 70001}, rng, -6.f, 6.f);  // past the chunk size: shared between threads
        for (int64_t i = 0; i < 200; ++i) x.data<float>()[i] = (static_cast<float>(i) - 100.f + 0.5f) * scale;  // ties (up to f32 rounding)
        const Tensor zp = t == DType::U8 ? Tensor::scalar<uint8_t>(117) : Tensor::scalar<int8_t>(-9);
        const Tensor s = Tensor::scalar<float>(scale);
        Node q{"q", "QuantizeLinear", "", {"x", "s", "z"}, {"y"}, {}};
        const KernelContext qctx{q, {&x, &s, &zp}, 21, nullptr};
        const Tensor fast_q = kernelForTactic(q, "fast")(qctx)[0], ref_q = referenceKernels().find("QuantizeLinear")(qctx)[0];
        ASSERT_EQ(fast_q.dtype(), t);
        EXPECT_EQ(std::memcmp(fast_q.raw(), ref_q.raw(), ref_q.byteSize()), 0) << dtypeName(t);
        Node dq{"dq", "DequantizeLinear", "", {"y", "s", "z"}, {"x"}, {}};
        const KernelContext dctx{dq, {&ref_q, &s, &zp}, 21, nullptr};
        const Tensor fast_dq = kernelForTactic(dq, "fast")(dctx)[0], ref_dq = referenceKernels().find("DequantizeLinear")(dctx)[0];
        EXPECT_EQ(std::memcmp(fast_dq.raw(), ref_dq.raw(), ref_dq.byteSize()), 0) << dtypeName(t);
    }
}

// A QDQ conv and matmul as ONNX Runtime's quantizer writes them: Q/DQ on the activations,
// DQ on int8 weights (per channel for the conv), an int32 bias dequantized with scale
// x_scale * w_scale.
Graph qdqModel(std::mt19937& rng, bool symmetric_weights) {
    Graph g = withInput({1, 8, 10, 10});
    g.opset = 21;
    auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out, Attributes a = {}) {
        g.nodes.push_back(Node{out + "_node", op, "", std::move(in), {out}, std::move(a)});
    };
    auto q8 = [&](const std::string& name, float scale, uint8_t zp) {
        g.initializers[name + "_s"] = Tensor::scalar<float>(scale);
        g.initializers[name + "_z"] = Tensor::scalar<uint8_t>(zp);
    };
    q8("x", 0.02f, 128), q8("c", 0.05f, 60), q8("m", 0.08f, 128);
    g.initializers["w"] = randomInts<int8_t>({16, 8, 3, 3}, rng, -127, 127);
    g.initializers["w_s"] = randomTensor({16}, rng, 0.002f, 0.004f);
    g.initializers["w_z"] = symmetric_weights ? Tensor(DType::I8, {16}) : randomInts<int8_t>({16}, rng, 1, 5);
    Tensor bias_scale(DType::F32, {16});
    for (int64_t c = 0; c < 16; ++c) bias_scale.data<float>()[c] = 0.02f * g.initializers["w_s"].data<float>()[c];
    g.initializers["b"] = randomInts<int32_t>({16}, rng, -3000, 3000);
    g.initializers["b_s"] = bias_scale;
    g.initializers["b_z"] = Tensor(DType::I32, {16});
    g.initializers["mw"] = randomInts<int8_t>({10, 6}, rng, -127, 127);
    g.initializers["mw_s"] = Tensor::scalar<float>(0.01f);
    g.initializers["mw_z"] = Tensor::scalar<int8_t>(0);
    Attributes conv, axis0, axis1;
    conv.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    axis0.set("axis", int64_t{0});
    add("QuantizeLinear", {"x", "x_s", "x_z"}, "xq");
    add("DequantizeLinear", {"xq", "x_s", "x_z"}, "xd");
    add("DequantizeLinear", {"w", "w_s", "w_z"}, "wd", axis0);
    add("DequantizeLinear", {"b", "b_s", "b_z"}, "bd", axis0);
    add("Conv", {"xd", "wd", "bd"}, "conv", conv);
    add("QuantizeLinear", {"conv", "c_s", "c_z"}, "cq");
    add("DequantizeLinear", {"cq", "c_s", "c_z"}, "cd");
    add("DequantizeLinear", {"mw", "mw_s", "mw_z"}, "mwd");
    add("MatMul", {"cd", "mwd"}, "mm");
    add("QuantizeLinear", {"mm", "m_s", "m_z"}, "mq");
    add("DequantizeLinear", {"mq", "m_s", "m_z"}, "y");
    g.outputs = {{"y", DType::F32, Shape::fromDims({1, 16, 10, 6})}};
    return g;
}

TEST(QdqFusion, FoldsConvAndMatMulIntoIntegerOpsWithinOneStep) {
    std::mt19937 rng(35);
    const Graph g = qdqModel(rng, true);
    const Graph fused = optimizeGraph(g, defaults());
    const auto ops = opTypes(fused);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QLinearConv"), 1) << dumpGraph(fused);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QLinearMatMul"), 1) << dumpGraph(fused);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Conv") + std::count(ops.begin(), ops.end(), "FusedConv"), 0) << dumpGraph(fused);
    TensorMap in = {{"x", randomTensor({1, 8, 10, 10}, rng, -2.5f, 2.5f)}};
    const Tensor want = GraphExecutor(g).run(in)[0], got = GraphExecutor(fused).run(in)[0];
    // One step of the last quantizer (0.08), and few elements off at all.
    int64_t off = 0;
    double worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
        const double d = std::fabs(got.scalarAt(i) - want.scalarAt(i));
        worst = std::max(worst, d), off += d > 1e-6;
    }
    EXPECT_LE(worst, 0.08 * 1.001);
    EXPECT_LT(off, want.numel() / 20);
    EXPECT_GT(compareOutputs(got, want, "y").cosine, 0.9999);

    RouteValues off_route = defaults();
    off_route["fusion.qdq"] = "off";
    const auto kept = opTypes(optimizeGraph(g, off_route));
    EXPECT_EQ(std::count(kept.begin(), kept.end(), "QLinearConv") + std::count(kept.begin(), kept.end(), "QLinearMatMul"), 0);
}

TEST(QdqFusion, LeavesAsymmetricWeightsAndSharedProductsInFloatingPoint) {
    std::mt19937 rng(36);
    const auto asymmetric = opTypes(optimizeGraph(qdqModel(rng, false), defaults()));
    EXPECT_EQ(std::count(asymmetric.begin(), asymmetric.end(), "QLinearConv"), 0);
    EXPECT_EQ(std::count(asymmetric.begin(), asymmetric.end(), "QLinearMatMul"), 1);  // its weights are symmetric

    Graph shared = qdqModel(rng, true);
    shared.outputs.push_back({"conv", DType::F32, Shape::fromDims({1, 16, 10, 10})});  // the float conv output is read: keep it
    const auto ops = opTypes(optimizeGraph(shared, defaults()));
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QLinearConv"), 0);
}

TEST(QdqFusion, ElementwiseChainsBetweenDqAndQBecomeExactLookups) {
    std::mt19937 rng(38);
    for (const DType t : {DType::U8, DType::I8}) {
        Graph g = withInput({2, 3, 5, 7});
        g.opset = 21;
        g.initializers["s"] = Tensor::scalar<float>(0.04f);
        g.initializers["z"] = t == DType::U8 ? Tensor::scalar<uint8_t>(130) : Tensor::scalar<int8_t>(3);
        g.initializers["s2"] = Tensor::scalar<float>(0.02f);
        g.initializers["z2"] = t == DType::U8 ? Tensor::scalar<uint8_t>(20) : Tensor::scalar<int8_t>(-100);
        g.initializers["half"] = Tensor::scalar<float>(0.5f);
        g.initializers["bias"] = Tensor::fromVector<float>({1, 1, 1, 1}, {0.1f});
        auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
            g.nodes.push_back(Node{out + "_node", op, "", std::move(in), {out}, {}});
        };
        add("QuantizeLinear", {"x", "s", "z"}, "xq");
        add("DequantizeLinear", {"xq", "s", "z"}, "xd");
        add("Mul", {"half", "xd"}, "m");
        add("HardSwish", {"m"}, "h");
        add("Add", {"h", "bias"}, "a");
        add("QuantizeLinear", {"a", "s2", "z2"}, "aq");
        add("DequantizeLinear", {"aq", "s2", "z2"}, "y");
        g.outputs = {{"y", DType::F32, Shape::fromDims({2, 3, 5, 7})}};
        const Graph fused = optimizeGraph(g, defaults());
        const auto ops = opTypes(fused);
        EXPECT_EQ(std::count(ops.begin(), ops.end(), "QuantizedLookup"), 1) << dumpGraph(fused);
        EXPECT_EQ(std::count(ops.begin(), ops.end(), "HardSwish") + std::count(ops.begin(), ops.end(), "ElementwiseChain"), 0) << dumpGraph(fused);
        TensorMap in = {{"x", randomTensor({2, 3, 5, 7}, rng, -6.f, 6.f)}};
        const Tensor want = GraphExecutor(g).run(in)[0], got = GraphExecutor(fused).run(in)[0];
        EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.byteSize()), 0) << dtypeName(t);
        // The fast lookup kernel against the reference one, on every code.
        for (const auto& n : fused.nodes) {
            if (n.op_type != "QuantizedLookup") continue;
            const Tensor& table = fused.initializers.at(n.inputs[1]);
            Tensor codes = t == DType::U8 ? randomInts<uint8_t>({3, 100000}, rng, 0, 255) : randomInts<int8_t>({3, 100000}, rng, -128, 127);
            const KernelContext ctx{n, {&codes, &table}, 21, nullptr};
            const Tensor fast = kernelForTactic(n, "fast")(ctx)[0], ref = referenceKernels().find("QuantizedLookup")(ctx)[0];
            EXPECT_EQ(std::memcmp(fast.raw(), ref.raw(), ref.byteSize()), 0);
        }
    }
}

TEST(QdqFusion, DataMovementRunsOnTheQuantizedTensorsExactly) {
    std::mt19937 rng(37);
    Graph g = withInput({2, 3, 4, 5});
    g.opset = 21;
    g.initializers["s"] = Tensor::scalar<float>(0.03f);
    g.initializers["z"] = Tensor::scalar<uint8_t>(121);
    g.initializers["s2"] = Tensor::scalar<float>(0.05f);  // another quantizer: that pair must stay
    Attributes perm, axis;
    perm.set("perm", std::vector<int64_t>{0, 2, 1, 3});
    axis.set("axis", int64_t{1});
    auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out, Attributes a = {}) {
        g.nodes.push_back(Node{out + "_node", op, "", std::move(in), {out}, std::move(a)});
    };
    add("QuantizeLinear", {"x", "s", "z"}, "xq");
    add("DequantizeLinear", {"xq", "s", "z"}, "xd");
    add("Transpose", {"xd"}, "t", perm);
    add("QuantizeLinear", {"t", "s", "z"}, "tq");
    add("DequantizeLinear", {"tq", "s", "z"}, "td");
    add("Concat", {"td", "td"}, "c", axis);
    add("QuantizeLinear", {"c", "s", "z"}, "cq");
    add("DequantizeLinear", {"cq", "s", "z"}, "cd");
    add("Transpose", {"cd"}, "t2", perm);
    add("QuantizeLinear", {"t2", "s2", "z"}, "t2q");
    add("DequantizeLinear", {"t2q", "s2", "z"}, "y");
    g.outputs = {{"y", DType::F32, Shape::fromDims({2, 8, 3, 5})}};
    const Graph moved = optimizeGraph(g, defaults());
    const auto ops = opTypes(moved);
    // x's Q, the two moved ops, the last Transpose's DQ -> Transpose -> Q (different scales) and y's DQ.
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QuantizeLinear"), 2) << dumpGraph(moved);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "DequantizeLinear"), 2) << dumpGraph(moved);
    TensorMap in = {{"x", randomTensor({2, 3, 4, 5}, rng, -3.f, 3.f)}};
    const Tensor want = GraphExecutor(g).run(in)[0], got = GraphExecutor(moved).run(in)[0];
    ASSERT_EQ(got.dims(), want.dims());
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.byteSize()), 0);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// x -> Conv -> Relu -> Conv -> y, f32 weights: two quantizable products.
Graph floatCnn(std::mt19937& rng) {
    Graph g = withInput({1, 4, 8, 8});
    g.opset = 17;
    g.initializers["w1"] = randomTensor({8, 4, 3, 3}, rng, -0.5f, 0.5f);
    g.initializers["b1"] = randomTensor({8}, rng, -0.1f, 0.1f);
    g.initializers["w2"] = randomTensor({6, 8, 1, 1}, rng, -0.5f, 0.5f);
    Attributes pads;
    pads.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    g.nodes = {Node{"c1", "Conv", "", {"x", "w1", "b1"}, {"h"}, pads}, Node{"r", "Relu", "", {"h"}, {"a"}, {}}, Node{"c2", "Conv", "", {"a", "w2"}, {"y"}, {}}};
    g.value_info["h"] = {"h", DType::F32, Shape::fromDims({1, 8, 8, 8})};
    g.value_info["a"] = {"a", DType::F32, Shape::fromDims({1, 8, 8, 8})};
    g.outputs = {{"y", DType::F32, Shape::fromDims({1, 6, 8, 8})}};
    return g;
}

TEST(Calibration, RangesAndTheInt8ModelMadeFromThem) {
    std::mt19937 rng(41);
    const Graph g = floatCnn(rng);
    EXPECT_EQ(quantizationPoints(withConstantsAsInitializers(g)), (std::vector<std::string>{"x", "a", "y"}));  // after the Relu, not before
    std::vector<TensorMap> samples;
    double lo = 1e9, hi = -1e9;
    for (int k = 0; k < 4; ++k) {
        samples.push_back({{"x", randomTensor({1, 4, 8, 8}, rng, -2.f, 3.f)}});
        const Tensor& x = samples.back()["x"];
        for (int64_t i = 0; i < x.numel(); ++i) lo = std::min(lo, x.scalarAt(i)), hi = std::max(hi, x.scalarAt(i));
    }
    const CalibrationTable minmax = calibrate(g, "hash", samples, "minmax");
    EXPECT_EQ(minmax.model_hash, "hash");
    EXPECT_DOUBLE_EQ(minmax.ranges.at("x").min, lo);
    EXPECT_DOUBLE_EQ(minmax.ranges.at("x").max, hi);
    EXPECT_GE(minmax.ranges.at("a").min, 0.0);  // Relu's output
    for (const char* method : {"percentile:99", "entropy"}) {  // inside the extremes
        const CalibrationTable t = calibrate(g, "hash", samples, method);
        for (const auto& [name, r] : t.ranges) {
            EXPECT_GE(r.min, minmax.ranges.at(name).min - 1e-6) << method << " " << name;
            EXPECT_LE(r.max, minmax.ranges.at(name).max + 1e-6) << method << " " << name;
            EXPECT_LT(r.max - r.min, minmax.ranges.at(name).max - minmax.ranges.at(name).min + 1e-6) << method << " " << name;
        }
    }
    EXPECT_THROW(calibrate(g, "hash", samples, "percentile:20"), Error);

    const Graph q = insertQdq(g, minmax);
    const auto ops = opTypes(optimizeGraph(q, defaults()));
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QLinearConvNhwc"), 2) << dumpGraph(optimizeGraph(q, defaults()));
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Relu"), 0);  // the Q's zero point clamps instead
    // Channels-last from the first conv to the last: one transpose in, one out.
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Transpose"), 2) << dumpGraph(optimizeGraph(q, defaults()));
    RouteValues nchw = defaults();
    nchw["layout.qconv"] = "nchw";
    const auto plain = opTypes(optimizeGraph(q, nchw));
    EXPECT_EQ(std::count(plain.begin(), plain.end(), "QLinearConv"), 2);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), "Transpose"), 0);
    const Tensor want = GraphExecutor(g).run(samples[0])[0], got = GraphExecutor(q).run(samples[0])[0];
    const ErrorStats e = compareOutputs(got, want, "y");
    EXPECT_LT(e.rel_l2, 0.03);
    EXPECT_GT(e.rel_l2, 1e-5);  // it is quantized
}

TEST(Calibration, FileRoundTrip) {
    TempDir dir;
    CalibrationTable t{"abc", "entropy", 3, {{"x", {-1.5, 2.25}}, {"y", {0.0, 7.0}}}};
    writeCalibration(t, (dir / "c.json").string());
    const CalibrationTable back = readCalibration((dir / "c.json").string());
    EXPECT_EQ(back.model_hash, "abc");
    EXPECT_EQ(back.samples, 3);
    EXPECT_DOUBLE_EQ(back.ranges.at("x").min, -1.5);
    EXPECT_DOUBLE_EQ(back.ranges.at("y").max, 7.0);
    writeFile(dir / "bad.json", "{\"ranges\": 3}");
    EXPECT_THROW(readCalibration((dir / "bad.json").string()), Error);
}

}  // namespace
}  // namespace kiln::testing

namespace kiln::testing {
namespace {

// x -> Conv -> BatchNormalization -> Clip(0, 6) -> Conv -> y, as MobileNetV2 exports unfolded.
TEST(Calibration, BatchNormsFoldAndRelu6BecomesTheQuantizersClamp) {
    std::mt19937 rng(42);
    Graph g = floatCnn(rng);
    g.initializers["bn_s"] = randomTensor({8}, rng, 0.5f, 1.5f);
    g.initializers["bn_b"] = randomTensor({8}, rng, -0.2f, 0.2f);
    g.initializers["bn_m"] = randomTensor({8}, rng, -0.1f, 0.1f);
    g.initializers["bn_v"] = randomTensor({8}, rng, 0.5f, 1.0f);
    g.initializers["zero"] = Tensor::scalar<float>(0.f);
    g.initializers["six"] = Tensor::scalar<float>(6.f);
    g.nodes[1] = Node{"bn", "BatchNormalization", "", {"h", "bn_s", "bn_b", "bn_m", "bn_v"}, {"n"}, {}};
    g.nodes.insert(g.nodes.begin() + 2, Node{"clip", "Clip", "", {"n", "zero", "six"}, {"a"}, {}});
    g.value_info["n"] = {"n", DType::F32, Shape::fromDims({1, 8, 8, 8})};
    std::vector<TensorMap> samples;
    for (int k = 0; k < 3; ++k) samples.push_back({{"x", randomTensor({1, 4, 8, 8}, rng, -4.f, 4.f)}});
    const CalibrationTable t = calibrate(g, "hash", samples, "minmax");
    EXPECT_TRUE(t.ranges.count("a")) << "the point is after the ReLU6";
    const Graph q = insertQdq(g, t);
    const Graph o = optimizeGraph(q, defaults());
    const auto ops = opTypes(o);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "QLinearConvNhwc"), 2) << dumpGraph(o);
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "Clip") + std::count(ops.begin(), ops.end(), "BatchNormalization"), 0) << dumpGraph(o);
    const Tensor want = GraphExecutor(g).run(samples[0])[0], got = GraphExecutor(q).run(samples[0])[0], fused = GraphExecutor(o).run(samples[0])[0];
    EXPECT_LT(compareOutputs(got, want, "y").rel_l2, 0.03);
    EXPECT_LT(compareOutputs(fused, got, "y").rel_l2, 0.02);  // the fused int8 kernels against the QDQ graph's reading
}

}  // namespace
}  // namespace kiln::testing
