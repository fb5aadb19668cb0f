// The op-conformance harness for the fast CPU backend: every tactic runs on randomized
// node configurations and must match the reference kernel of the same node.
#include <gtest/gtest.h>

#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/softmax_row.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/channel_blocks.h"
#include "runtime/accuracy.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

struct Case {
    Node node;
    std::vector<Tensor> inputs;  // undefined tensor = omitted input
};

void expectTacticMatchesReference(const Case& c, const std::string& tactic_name) {
    const Tactic* tactic = nullptr;
    for (const auto& t : fastTactics())
        if (t.name == tactic_name && std::find(t.ops.begin(), t.ops.end(), c.node.op_type) != t.ops.end()) tactic = &t;
    ASSERT_NE(tactic, nullptr) << tactic_name << " for " << c.node.op_type;
    std::vector<const Tensor*> ptrs;
    for (const auto& t : c.inputs) ptrs.push_back(t.defined() ? &t : nullptr);
    KernelContext ctx{c.node, ptrs, 17, nullptr};
    auto want = referenceKernels().find(c.node.op_type)(ctx);
    auto got = tactic->kernel(ctx);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].dims(), want[i].dims()) << dumpGraph(Graph{});
        EXPECT_LT(compareOutputs(got[i], want[i], "y").rel_l2, 2e-6) << c.node.op_type << " " << tactic_name << " strides " << attributeToString(Attribute(c.node.attrs.getInts("strides"))) << " group " << c.node.attrs.getInt("group", 1) << " inputs " << c.inputs.size();
    }
}

Node node(const std::string& op, const std::string& domain = "") { return Node{"n", op, domain, {}, {"y"}, {}}; }

}  // namespace

// "blas", and "dnnl" when Kiln was built with oneDNN.
std::vector<std::string> gemmTacticNames() {
    std::vector<std::string> names;
    for (const auto& t : fastTactics())
        if (t.op_class == "gemm") names.push_back(t.name);
    return names;
}

TEST(FastBackend, GemmTacticMatchesReference) {
    std::mt19937 rng(21);
    for (auto [a, b] : std::vector<std::pair<Dims, Dims>>{{{3, 5}, {5, 4}}, {{1, 7}, {7, 3}}, {{2, 3, 5}, {5, 4}}, {{2, 1, 3, 5}, {4, 5, 6}}}) {
        Case c{node("MatMul"), {randomTensor(a, rng), randomTensor(b, rng)}};
        for (const auto& t : gemmTacticNames()) expectTacticMatchesReference(c, t);
    }
    for (const char* act : {"none", "Relu", "Gelu", "GeluTanh", "Clip", "Sigmoid"}) {
        for (int64_t tb : {0, 1}) {
            Case c{node("FusedMatMul", "kiln"), {randomTensor({2, 4, 6}, rng), randomTensor(tb ? Dims{5, 6} : Dims{6, 5}, rng), randomTensor({5}, rng)}};
            c.node.attrs.set("trans_b", tb);
            c.node.attrs.set("activation", std::string(act));
            c.node.attrs.set("activation_params", std::vector<float>{-0.5f, 0.5f});
            for (const auto& t : gemmTacticNames()) expectTacticMatchesReference(c, t);
        }
    }
    // A residual (input 3), with and without a bias, then an activation; one that broadcasts
    // takes the reference path inside the tactic.
    for (const Dims& rd : {Dims{2, 4, 5}, Dims{4, 5}})
        for (bool with_bias : {true, false}) {
            Case c{node("FusedMatMul", "kiln"), {randomTensor({2, 4, 6}, rng), randomTensor({6, 5}, rng), with_bias ? randomTensor({5}, rng) : Tensor{}, randomTensor(rd, rng)}};
            c.node.attrs.set("activation", std::string("Relu"));
            for (const auto& t : gemmTacticNames()) expectTacticMatchesReference(c, t);
        }
    for (int64_t ta : {0, 1})
        for (int64_t tb : {0, 1})
            for (const Dims& cd : {Dims{}, Dims{5}, Dims{3, 5}, Dims{3, 1}}) {
                Case c{node("Gemm"), {randomTensor(ta ? Dims{4, 3} : Dims{3, 4}, rng), randomTensor(tb ? Dims{5, 4} : Dims{4, 5}, rng)}};
                if (!cd.empty()) c.inputs.push_back(randomTensor(cd, rng));
                c.node.attrs.set("transA", ta);
                c.node.attrs.set("transB", tb);
                c.node.attrs.set("alpha", 0.7f);
                c.node.attrs.set("beta", cd.size() == 1 ? 1.0f : 1.3f);
                for (const auto& t : gemmTacticNames()) expectTacticMatchesReference(c, t);
            }
}

TEST(FastBackend, ConvTacticsMatchReference) {
    std::mt19937 rng(8);
    struct Geo {
        int64_t c, m, k, stride, pad, dil, group;
    };
    for (const Geo& geo : std::vector<Geo>{{3, 8, 3, 1, 1, 1, 1}, {4, 6, 1, 1, 0, 1, 1}, {4, 6, 3, 2, 1, 1, 2}, {5, 5, 3, 1, 1, 1, 5}, {6, 6, 3, 2, 1, 1, 6},
                                           {4, 4, 5, 1, 2, 2, 4}, {3, 4, 3, 2, 0, 1, 1}, {8, 8, 3, 1, 0, 1, 8}}) {
        for (bool fused : {false, true}) {
            Case c{node(fused ? "FusedConv" : "Conv", fused ? "kiln" : ""),
                   {randomTensor({2, geo.c, 9, 11}, rng), randomTensor({geo.m, geo.c / geo.group, geo.k, geo.k}, rng), randomTensor({geo.m}, rng)}};
            c.node.attrs.set("strides", std::vector<int64_t>{geo.stride, geo.stride});
            c.node.attrs.set("pads", std::vector<int64_t>{geo.pad, geo.pad, geo.pad, geo.pad});
            c.node.attrs.set("dilations", std::vector<int64_t>{geo.dil, geo.dil});
            c.node.attrs.set("group", geo.group);
            if (fused) {
                c.node.attrs.set("activation", std::string("Clip"));
                c.node.attrs.set("activation_params", std::vector<float>{0.0f, 1.0f});
                const int64_t oh = (9 + 2 * geo.pad - (geo.k - 1) * geo.dil - 1) / geo.stride + 1, ow = (11 + 2 * geo.pad - (geo.k - 1) * geo.dil - 1) / geo.stride + 1;
                c.inputs.push_back(randomTensor({2, geo.m, oh, ow}, rng));  // residual
            }
            expectTacticMatchesReference(c, "gemm");
            for (const auto& t : fastTactics())
                if (t.name == "gemm_dnnl") expectTacticMatchesReference(c, t.name);  // built with oneDNN
            expectTacticMatchesReference(c, "direct");  // strided/grouped ones fall back to gemm inside
            expectTacticMatchesReference(c, "winograd");  // others than 3x3 stride 1 take the reference inside
            if (geo.group == geo.c && geo.m == geo.c) expectTacticMatchesReference(c, "depthwise");
        }
    }
    // Winograd F(2x2, 3x3): odd and even output sizes (partial edge tiles), asymmetric and no
    // padding, one output row or column, many channels (the sgemm's depth), each epilogue.
    for (const char* act : {"none", "Relu", "Clip"})
        for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{9, 11}, {8, 8}, {3, 17}, {16, 3}, {13, 6}})
            for (int64_t pad : {0, 1}) {
                const int64_t C = h == 8 ? 37 : 5, M = 7;
                Case c{node("FusedConv", "kiln"), {randomTensor({2, C, h, w}, rng), randomTensor({M, C, 3, 3}, rng), randomTensor({M}, rng)}};
                c.node.attrs.set("pads", std::vector<int64_t>{pad, 0, pad, 1});
                c.node.attrs.set("activation", std::string(act));
                c.node.attrs.set("activation_params", std::vector<float>{-0.5f, 0.5f});
                const int64_t oh = h + 2 * pad - 2, ow = w + 1 - 2;
                if (std::string(act) == "Clip") c.inputs.push_back(randomTensor({2, M, oh, ow}, rng));  // residual
                expectTacticMatchesReference(c, "winograd");
            }
    {  // 2,048 channels: tiles go in blocks of 64, two here (72 tiles), the first across both images
        Case c{node("Conv"), {randomTensor({2, 2048, 12, 12}, rng), randomTensor({7, 2048, 3, 3}, rng), randomTensor({7}, rng)}};
        c.node.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
        expectTacticMatchesReference(c, "winograd");
    }
    // 1x1 convs over batches of small planes (the images side by side in one sgemm), each epilogue.
    for (const char* act : {"none", "Clip", "Sigmoid"})
        for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{7, 7}, {5, 3}})
            for (const auto& t : fastTactics()) {
                if (t.op_class != "conv" || (t.name != "gemm" && t.name != "gemm_dnnl")) continue;
                Case c{node("FusedConv", "kiln"), {randomTensor({3, 20, h, w}, rng), randomTensor({10, 20, 1, 1}, rng), randomTensor({10}, rng)}};
                c.node.attrs.set("activation", std::string(act));
                c.node.attrs.set("activation_params", std::vector<float>{-0.5f, 0.5f});
                if (std::string(act) == "Clip") c.inputs.push_back(randomTensor({3, 10, h, w}, rng));  // residual
                expectTacticMatchesReference(c, t.name);
            }
    // 3x3 depthwise at the plane sizes of MobileNets and odd ones: the stride-1 flat-plane
    // stencil (its vector body, its wrapped columns and its top/bottom rows), masked row
    // vectors on planes up to 8 wide, the stencil over a zero-bordered copy (9- to 16-wide
    // planes at stride 1, narrow ones at stride 2; a last vector past the plane's end) and the
    // stride-2 AVX2 rows (several 8-column steps, then the scalar tail).
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{3, 3}, {7, 7}, {14, 14}, {5, 29}, {4, 3}, {3, 40}, {33, 58}, {9, 16}, {13, 10}, {6, 9}, {11, 8}, {3, 5}})
        for (int64_t stride : {1, 2}) {
            Case c{node("FusedConv", "kiln"), {randomTensor({1, 3, h, w}, rng), randomTensor({3, 1, 3, 3}, rng), randomTensor({3}, rng)}};
            c.node.attrs.set("strides", std::vector<int64_t>{stride, stride});
            c.node.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
            c.node.attrs.set("group", int64_t{3});
            c.node.attrs.set("activation", std::string("Clip"));
            c.node.attrs.set("activation_params", std::vector<float>{-0.5f, 1.0f});
            expectTacticMatchesReference(c, "depthwise");
        }
    // The direct tactic's full 16-column blocks, a partial last block, channels not a multiple
    // of 4, asymmetric pads, and each in-register epilogue (none, Relu, Clip + residual) or not (Sigmoid).
    for (const char* act : {"none", "Relu", "Clip", "Sigmoid"})
        for (int64_t k : {1, 3, 5, 7, 2})
            for (int64_t stride : {1, 2}) {
                Case c{node("FusedConv", "kiln"), {randomTensor({2, 5, 13, 37}, rng), randomTensor({7, 5, k, k}, rng), randomTensor({7}, rng)}};
                c.node.attrs.set("pads", std::vector<int64_t>{k / 2, 0, k / 2, k - 1});
                c.node.attrs.set("strides", std::vector<int64_t>{stride, stride});
                c.node.attrs.set("activation", std::string(act));
                c.node.attrs.set("activation_params", std::vector<float>{-0.5f, 0.5f});
                const int64_t oh = (13 + 2 * (k / 2) - k) / stride + 1, ow = (37 + (k - 1) - k) / stride + 1;
                if (std::string(act) == "Clip") c.inputs.push_back(randomTensor({2, 7, oh, ow}, rng));
                expectTacticMatchesReference(c, "direct");
            }
}

// The channel-blocked layout's definition: element (n, c, h, w) at [n, c / 8, h, w, c % 8],
// lanes past C zero; packed weights at the offsets oneDNN's format tags give them. Then the
// fast reorders and blocked pooling against the reference kernels, which run the plain pool
// on the unblocked input.
TEST(FastBackend, ChannelBlockKernelsMatchReference) {
    std::mt19937 rng(30);
    const Tensor x = randomTensor({2, 11, 3, 5}, rng);
    const Tensor y = blockChannels(x);
    ASSERT_EQ(y.dims(), (Dims{2, 2, 3, 5, 8}));
    for (int64_t n = 0; n < 2; ++n)
        for (int64_t c = 0; c < 16; ++c)
            for (int64_t p = 0; p < 15; ++p)
                EXPECT_EQ(y.data<float>()[((n * 2 + c / 8) * 15 + p) * 8 + c % 8], c < 11 ? x.data<float>()[(n * 11 + c) * 15 + p] : 0.f);
    EXPECT_EQ(compareOutputs(unblockChannels(y, 11), x, "x").max_abs, 0.0);
    const Tensor x16 = randomTensor({2, 19, 3, 5}, rng), y16 = blockChannels(x16, 16);  // blocks of 16 (AVX-512)
    ASSERT_EQ(y16.dims(), (Dims{2, 2, 3, 5, 16}));
    for (int64_t n = 0; n < 2; ++n)
        for (int64_t c = 0; c < 32; ++c)
            for (int64_t p = 0; p < 15; ++p)
                EXPECT_EQ(y16.data<float>()[((n * 2 + c / 16) * 15 + p) * 16 + c % 16], c < 19 ? x16.data<float>()[(n * 19 + c) * 15 + p] : 0.f);
    EXPECT_EQ(compareOutputs(unblockChannels(y16, 19), x16, "x").max_abs, 0.0);
    EXPECT_THROW(blockChannels(x, 4), Error);
    EXPECT_THROW(unblockChannels(y16, 11), Error);  // 11 channels fill one block of 16, not two
    const Tensor w = randomTensor({10, 9, 2, 3}, rng), dw = randomTensor({10, 1, 3, 3}, rng);
    const Tensor oi = packConvWeights(w, "OIhw8i8o"), ohwi = packConvWeights(w, "Ohwi8o"), g = packConvWeights(dw, "Goihw8g");
    EXPECT_EQ(oi.dims(), (Dims{2, 2, 2, 3, 8, 8}));
    const float wv = w.data<float>()[((9 * 9 + 8) * 2 + 1) * 3 + 2];  // o = 9, i = 8, h = 1, w = 2
    EXPECT_EQ(oi.data<float>()[((((1 * 2 + 1) * 2 + 1) * 3 + 2) * 8 + 0) * 8 + 1], wv);
    EXPECT_EQ(ohwi.data<float>()[(((1 * 2 + 1) * 3 + 2) * 9 + 8) * 8 + 1], wv);
    EXPECT_EQ(g.data<float>()[((1 * 3 + 2) * 3 + 1) * 8 + 1], dw.data<float>()[(9 * 3 + 2) * 3 + 1]);  // g = 9, h = 2, w = 1
    EXPECT_EQ(compareOutputs(unpackConvWeights(oi, "OIhw8i8o", w.dims()), w, "w").max_abs, 0.0);
    EXPECT_EQ(compareOutputs(unpackConvWeights(ohwi, "Ohwi8o", w.dims()), w, "w").max_abs, 0.0);
    EXPECT_EQ(compareOutputs(unpackConvWeights(g, "Goihw8g", dw.dims()), dw, "w").max_abs, 0.0);
    const Tensor oi16 = packConvWeights(w, "OIhw16i16o"), ohwi16 = packConvWeights(w, "Ohwi16o"), g16 = packConvWeights(dw, "Goihw16g");
    EXPECT_EQ(oi16.dims(), (Dims{1, 1, 2, 3, 16, 16}));
    EXPECT_EQ(oi16.data<float>()[(((1 * 3 + 2) * 16 + 8) * 16) + 9], wv);
    EXPECT_EQ(ohwi16.data<float>()[((1 * 3 + 2) * 9 + 8) * 16 + 9], wv);
    EXPECT_EQ(g16.data<float>()[((2 * 3 + 1) * 16) + 9], dw.data<float>()[(9 * 3 + 2) * 3 + 1]);
    EXPECT_EQ(compareOutputs(unpackConvWeights(oi16, "OIhw16i16o", w.dims()), w, "w").max_abs, 0.0);
    EXPECT_EQ(compareOutputs(unpackConvWeights(ohwi16, "Ohwi16o", w.dims()), w, "w").max_abs, 0.0);
    EXPECT_EQ(compareOutputs(unpackConvWeights(g16, "Goihw16g", dw.dims()), dw, "w").max_abs, 0.0);
    EXPECT_THROW(packConvWeights(w, "OIhw4i4o"), Error);
    for (int64_t block : {8, 16})
        for (int64_t C : {3, 8, 20, 35})
            for (auto [h, w2] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {5, 7}, {1, 1}, {13, 9}}) {
                Case b{node("BlockChannels", "kiln"), {randomTensor({2, C, h, w2}, rng)}};
                b.node.attrs.set("block", block);
                expectTacticMatchesReference(b, "fast");
                Case u{node("UnblockChannels", "kiln"), {blockChannels(randomTensor({2, C, h, w2}, rng), block)}};
                u.node.attrs.set("channels", C);
                expectTacticMatchesReference(u, "fast");
            }
    struct Pool {
        const char* op;
        std::vector<int64_t> kernel, strides, pads;
        int64_t ceil, include_pad = 0;
    };
    for (const Pool& p : std::vector<Pool>{{"MaxPool", {3, 3}, {2, 2}, {1, 1, 1, 1}, 0},
                                           {"MaxPool", {2, 2}, {2, 2}, {0, 0, 0, 0}, 1},
                                           {"AveragePool", {2, 2}, {1, 1}, {1, 1, 0, 0}, 0},
                                           {"AveragePool", {3, 3}, {2, 2}, {0, 0, 0, 0}, 1},
                                           {"AveragePool", {3, 3}, {1, 1}, {1, 1, 1, 1}, 0, 1},  // Inception's: padding counted
                                           {"AveragePool", {3, 3}, {2, 2}, {1, 0, 0, 1}, 1, 1},  // ceil windows past the padding
                                           {"GlobalAveragePool", {}, {}, {}, 0},
                                           {"GlobalMaxPool", {}, {}, {}, 0}})
    for (int64_t block : {8, 16}) {
        Tensor in = randomTensor({2, 12, 7, 9}, rng);
        if (std::string(p.op) == "MaxPool") in.data<float>()[17] = NAN;  // NaN wins a max window
        Case c{node("BlockedPool", "kiln"), {blockChannels(in, block)}};
        c.node.attrs.set("pool", std::string(p.op));
        c.node.attrs.set("channels", int64_t{12});
        if (!p.kernel.empty()) {
            c.node.attrs.set("kernel_shape", p.kernel);
            c.node.attrs.set("strides", p.strides);
            c.node.attrs.set("pads", p.pads);
            c.node.attrs.set("ceil_mode", p.ceil);
            c.node.attrs.set("count_include_pad", p.include_pad);
        }
        if (std::string(p.op) == "MaxPool") {  // NaN positions must agree; compare the rest
            const KernelContext ctx{c.node, {&c.inputs[0]}, 17, nullptr};
            const Tensor want = referenceKernels().find("BlockedPool")(ctx)[0], got = kernelForTactic(c.node, "fast")(ctx)[0];
            ASSERT_EQ(got.dims(), want.dims());
            int nans = 0;
            for (int64_t i = 0; i < want.numel(); ++i) {
                const float a = got.data<float>()[i], b = want.data<float>()[i];
                nans += std::isnan(b);
                EXPECT_TRUE(std::isnan(b) ? std::isnan(a) : a == b) << p.op << " element " << i;
            }
            EXPECT_GT(nans, 0);
        } else {
            expectTacticMatchesReference(c, "fast");
        }
    }
}

// Channel-blocked convs (layout.conv=nchw8c and nchw16c): the dnnl tactic (when built with oneDNN) and the
// reference kernel, on blocked inputs and packed weights, against the plain NCHW reference
// conv of the same node, blocked afterwards (padded lanes must come out zero).
TEST(FastBackend, BlockedConvMatchesThePlainReference) {
    std::mt19937 rng(31);
    struct Geo {
        int64_t c, m, k, stride, pt, pl, pb, pr, dil, group;
        const char* act;
        bool bias, residual;
    };
    const std::vector<Geo> geos = {
        {3, 16, 3, 2, 1, 1, 1, 1, 1, 1, "Clip", true, false},  // a first layer: plain input (Ohwi8o)
        {5, 13, 3, 1, 1, 0, 1, 2, 1, 1, "Relu", false, true},  // plain input, output not whole blocks, asymmetric pads
        {12, 12, 3, 1, 1, 1, 1, 1, 1, 12, "none", true, false},  // depthwise (Goihw8g), partial last block
        {24, 24, 3, 2, 1, 1, 1, 1, 1, 24, "Clip", true, true},   // depthwise, stride 2
        {16, 20, 1, 1, 0, 0, 0, 0, 1, 1, "none", true, true},    // 1x1 (OIhw8i8o) with a residual
        {12, 20, 1, 2, 0, 0, 0, 0, 1, 1, "Sigmoid", true, false},
        {20, 9, 3, 1, 2, 2, 2, 2, 2, 1, "LeakyRelu", true, true},  // dilation 2
        {8, 8, 5, 1, 2, 1, 2, 0, 1, 1, "Tanh", false, false},
        {16, 8, 3, 1, 1, 1, 1, 1, 1, 1, "HardSwish", true, false},
        {16, 8, 3, 1, 1, 1, 1, 1, 1, 1, "Gelu", true, false},
        {16, 8, 3, 1, 1, 1, 1, 1, 1, 1, "GeluTanh", true, true},
        {16, 8, 3, 1, 1, 1, 1, 1, 1, 1, "Softplus", true, false},
        {16, 24, 1, 1, 0, 0, 0, 0, 1, 1, "HardSigmoid", true, false},  // a squeeze-excite gate: linear, then clip
        {8, 8, 3, 1, 1, 1, 1, 1, 1, 1, "HardSigmoid", false, true},
        {16, 8, 3, 1, 1, 1, 1, 1, 1, 1, "Silu", true, false},  // x * sigmoid(x): oneDNN's swish
        {8, 16, 1, 1, 0, 0, 0, 0, 1, 1, "Silu", false, true},
    };
    std::vector<std::string> tactics = {"reference"};
    for (const auto& t : fastTactics())
        if (t.name == "dnnl" && t.op_class == "conv") tactics.push_back("dnnl");
    for (int64_t block : {8, 16})
        for (const Geo& geo : geos) {
            const int64_t N = 2, H = 9, W = 11;
            const int64_t OH = (H + geo.pt + geo.pb - (geo.k - 1) * geo.dil - 1) / geo.stride + 1, OW = (W + geo.pl + geo.pr - (geo.k - 1) * geo.dil - 1) / geo.stride + 1;
            const Tensor x = randomTensor({N, geo.c, H, W}, rng), w = randomTensor({geo.m, geo.c / geo.group, geo.k, geo.k}, rng);
            const Tensor b = geo.bias ? randomTensor({geo.m}, rng) : Tensor{}, z = geo.residual ? randomTensor({N, geo.m, OH, OW}, rng) : Tensor{};
            Node plain = node("FusedConv", "kiln");
            plain.attrs.set("strides", std::vector<int64_t>{geo.stride, geo.stride});
            plain.attrs.set("pads", std::vector<int64_t>{geo.pt, geo.pl, geo.pb, geo.pr});
            plain.attrs.set("dilations", std::vector<int64_t>{geo.dil, geo.dil});
            plain.attrs.set("group", geo.group);
            plain.attrs.set("activation", std::string(geo.act));
            plain.attrs.set("activation_params", std::string(geo.act) == "LeakyRelu" ? std::vector<float>{0.1f} : std::vector<float>{-0.5f, 0.5f});
            const Tensor want = blockChannels(
                referenceKernels().find("FusedConv")(KernelContext{plain, {&x, &w, b.defined() ? &b : nullptr, z.defined() ? &z : nullptr}, 17, nullptr})[0], block);
            const std::string layout = packedConvWeightLayout(
                geo.group > 1 ? PackedConvWeights::Goihwg : geo.c < 8 ? PackedConvWeights::Ohwio : PackedConvWeights::OIhwIO, block);
            Node blocked = plain;
            blocked.attrs.set("data_layout", blockedDataLayout(block));
            blocked.attrs.set("weight_layout", layout);
            blocked.attrs.set("weight_dims", std::vector<int64_t>(w.dims().begin(), w.dims().end()));
            const bool plain_src = packedConvWeightKind(layout) == PackedConvWeights::Ohwio;
            if (plain_src) blocked.attrs.set("src_layout", std::string("NCHW"));
            const Tensor bx = plain_src ? x : blockChannels(x, block), bw = packConvWeights(w, layout), bz = z.defined() ? blockChannels(z, block) : Tensor{};
            const KernelContext ctx{blocked, {&bx, &bw, b.defined() ? &b : nullptr, bz.defined() ? &bz : nullptr}, 17, nullptr};
            for (const auto& tactic : tactics) {
                const Tensor got = kernelForTactic(blocked, tactic)(ctx)[0];
                ASSERT_EQ(got.dims(), want.dims()) << tactic;
                EXPECT_LT(compareOutputs(got, want, "y").rel_l2, 1e-5) << tactic << " " << layout << " " << geo.act << " c" << geo.c << " m" << geo.m << " k" << geo.k;
            }
        }
}

// The blocked conv keeps its geometry and primitive in the node's KernelMemo between runs:
// a run with other input dims or another thread count must not reuse them. The sizes cross
// the one-thread rule (dense convs under 2 MFLOP): 1x16x6x6 is 0.3 MFLOP, 3x16x20x20 7 MFLOP.
TEST(FastBackend, BlockedConvMemoFollowsInputDimsAndThreads) {
    bool dnnl = false;
    for (const auto& t : fastTactics()) dnnl |= t.name == "dnnl" && t.op_class == "conv";
    if (!dnnl) GTEST_SKIP() << "built without oneDNN: no dnnl conv tactic";
    std::mt19937 rng(43);
    const int64_t C = 16, M = 32, block = 16;
    const Tensor w = randomTensor({M, C, 3, 3}, rng), b = randomTensor({M}, rng);
    Node plain = node("FusedConv", "kiln");
    plain.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
    plain.attrs.set("activation", std::string("Relu"));
    Node blocked = plain;
    blocked.attrs.set("data_layout", blockedDataLayout(block));
    const std::string layout = packedConvWeightLayout(PackedConvWeights::OIhwIO, block);
    blocked.attrs.set("weight_layout", layout);
    blocked.attrs.set("weight_dims", std::vector<int64_t>{M, C, 3, 3});
    const Tensor bw = packConvWeights(w, layout);
    KernelMemo memo;
    const int threads = cpuThreads();
    struct Run {
        int64_t n, hw;
        int threads;
    };
    for (const Run& r : {Run{1, 6, threads}, Run{3, 20, threads}, Run{1, 6, threads}, Run{3, 20, 1}, Run{2, 9, threads}}) {
        setCpuThreads(r.threads);
        const Tensor x = randomTensor({r.n, C, r.hw, r.hw}, rng), bx = blockChannels(x, block);
        const Tensor want = blockChannels(referenceKernels().find("FusedConv")(KernelContext{plain, {&x, &w, &b}, 17, nullptr})[0], block);
        KernelContext ctx{blocked, {&bx, &bw, &b}, 17, nullptr};
        ctx.memo = &memo;
        const Tensor got = kernelForTactic(blocked, "dnnl")(ctx)[0];
        ASSERT_EQ(got.dims(), want.dims()) << r.n << "x" << r.hw;
        EXPECT_LT(compareOutputs(got, want, "y").rel_l2, 1e-5) << r.n << "x" << r.hw << " threads " << r.threads;
    }
    setCpuThreads(threads);
}

TEST(FastBackend, NormAttentionAndChainTacticsMatchReference) {
    std::mt19937 rng(3);
    Case ln{node("LayerNormalization"), {randomTensor({3, 4, 32}, rng), randomTensor({32}, rng), randomTensor({32}, rng)}};
    ln.node.attrs.set("epsilon", 1e-5f);
    expectTacticMatchesReference(ln, "fast");
    Case sm{node("Softmax"), {randomTensor({3, 4, 17}, rng, -5, 5)}};
    expectTacticMatchesReference(sm, "fast");
    for (bool masked : {false, true}) {
        Case att{node("Attention", "kiln"), {randomTensor({2, 3, 5, 8}, rng), randomTensor({2, 3, 8, 7}, rng), randomTensor({2, 3, 7, 4}, rng)}};
        if (masked) att.inputs.push_back(randomTensor({2, 1, 1, 7}, rng));
        att.node.attrs.set("scale", 0.3f);
        expectTacticMatchesReference(att, "fast");
    }
    for (bool bshd : {false, true}) {  // 70 query rows: three tasks per head, the last one partial
        Case att{node("Attention", "kiln"), bshd ? std::vector<Tensor>{randomTensor({1, 70, 2, 8}, rng), randomTensor({1, 9, 2, 8}, rng), randomTensor({1, 9, 2, 4}, rng)}
                                                 : std::vector<Tensor>{randomTensor({1, 2, 70, 8}, rng), randomTensor({1, 2, 8, 9}, rng), randomTensor({1, 2, 9, 4}, rng)}};
        att.inputs.push_back(randomTensor({1, 1, 70, 9}, rng));
        att.node.attrs.set("scale", 0.3f);
        if (bshd) att.node.attrs.set("layout", std::string("bshd"));
        expectTacticMatchesReference(att, "fast");
    }
    for (bool masked : {false, true}) {  // the "bshd" layout: q [B, S, H, D], k [B, T, H, D], v [B, T, H, E]
        Case att{node("Attention", "kiln"), {randomTensor({2, 5, 3, 8}, rng), randomTensor({2, 7, 3, 8}, rng), randomTensor({2, 7, 3, 4}, rng)}};
        if (masked) att.inputs.push_back(randomTensor({2, 1, 5, 7}, rng));
        att.node.attrs.set("scale", 0.3f);
        att.node.attrs.set("layout", std::string("bshd"));
        expectTacticMatchesReference(att, "fast");
    }
    Case chain{node("ElementwiseChain", "kiln"), {randomTensor({4, 6}, rng, 0.5, 2), randomTensor({6}, rng, 0.5, 2), randomTensor({4, 6}, rng, 0.5, 2)}};
    chain.node.attrs.set("ops", std::vector<std::string>{"Mul", "Sigmoid", "Sub", "Div", "Relu"});
    chain.node.attrs.set("operand", std::vector<int64_t>{1, -1, 2, 1, -1});
    chain.node.attrs.set("swapped", std::vector<int64_t>{0, 0, 1, 0, 0});
    chain.node.attrs.set("params", std::vector<float>(10, 0.0f));
    expectTacticMatchesReference(chain, "fast");
    // Longer than a block of the fast kernel (1024), with a per-row operand whose period
    // (1000) wraps inside blocks, a one-element operand and the remaining binary ops.
    Case longer{node("ElementwiseChain", "kiln"), {randomTensor({3, 1000}, rng, 0.5, 2), randomTensor({1000}, rng, 0.5, 2), randomTensor({1}, rng, 0.5, 2),
                                                   randomTensor({3, 1000}, rng, -2, 2)}};
    longer.node.attrs.set("ops", std::vector<std::string>{"Add", "Pow", "Max", "Gelu", "Min", "Sub", "Mul"});
    longer.node.attrs.set("operand", std::vector<int64_t>{1, 2, 3, -1, 1, 2, 3});
    longer.node.attrs.set("swapped", std::vector<int64_t>{0, 1, 0, 0, 0, 1, 0});
    longer.node.attrs.set("params", std::vector<float>(14, 0.0f));
    expectTacticMatchesReference(longer, "fast");
}

// Binary ops under every broadcast the zoo shows: scalars, per-channel [C,1,1] and
// [N,C,1,1] operands, trailing-dim vectors, the smaller operand on either side, blocked
// layouts' [1,C/16,1,1,16] biases, and an output large enough to split across the team.
TEST(FastBackend, BinaryBroadcastsMatchReference) {
    std::mt19937 rng(12);
    const std::vector<std::pair<Dims, Dims>> shapes = {
        {{2, 3, 4, 5}, {2, 3, 4, 5}}, {{2, 3, 4, 5}, {3, 1, 1}}, {{2, 3, 4, 5}, {1}},    {{2, 3, 4, 5}, {5}},
        {{2, 3, 4, 5}, {2, 1, 4, 1}}, {{3, 1, 1}, {2, 3, 4, 5}}, {{1, 3, 1, 5}, {2, 1, 4, 1}}, {{1, 4, 7, 7, 16}, {1, 4, 1, 1, 16}},
        {{1, 64, 40, 40}, {1, 64, 1, 1}}, {{}, {3, 2}},
    };
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})
        for (const auto& [a, b] : shapes) {
            const bool pow = std::string(op) == "Pow";
            Case c{node(op), {randomTensor(a, rng, pow ? 0.5 : -2, 2), randomTensor(b, rng, pow ? -1.5 : 0.5, 2)}};
            expectTacticMatchesReference(c, "fast");
        }
}

// ElementwiseChain operands that broadcast into the chain's input: per-channel scale and
// shift on NCHW and on a blocked layout, a scalar, a trailing vector, and a large input.
TEST(FastBackend, ChainBroadcastOperandsMatchReference) {
    std::mt19937 rng(13);
    for (const Dims& x : {Dims{2, 16, 9, 9}, Dims{1, 4, 7, 7, 16}, Dims{1, 96, 30, 30}}) {
        const bool blocked = x.size() == 5;
        const Dims channel = blocked ? Dims{1, 4, 1, 1, 16} : Dims{x[1], 1, 1};
        const Dims batch_channel = blocked ? Dims{1, 4, 1, 1, 16} : Dims{x[0], x[1], 1, 1};
        Case c{node("ElementwiseChain", "kiln"),
               {randomTensor(x, rng, -2, 2), randomTensor(channel, rng, 0.5, 2), randomTensor({1}, rng, 0.5, 2), randomTensor(batch_channel, rng, -1, 1),
                randomTensor({x.back()}, rng, -1, 1)}};
        c.node.attrs.set("ops", std::vector<std::string>{"Mul", "Add", "Sigmoid", "Mul", "Sub", "Div", "Add"});
        c.node.attrs.set("operand", std::vector<int64_t>{1, 2, -1, 3, 4, 1, 2});
        c.node.attrs.set("swapped", std::vector<int64_t>{0, 1, 0, 0, 1, 0, 0});
        c.node.attrs.set("params", std::vector<float>(14, 0.0f));
        expectTacticMatchesReference(c, "fast");
    }
    // The flowing input broadcast too: ConvNeXt's layer scale [C, 1, 1] times the block's
    // output, plus the residual.
    Case scale{node("ElementwiseChain", "kiln"), {randomTensor({8, 1, 1}, rng), randomTensor({2, 8, 5, 6}, rng), randomTensor({2, 8, 5, 6}, rng)}};
    scale.node.attrs.set("ops", std::vector<std::string>{"Mul", "Add"});
    scale.node.attrs.set("operand", std::vector<int64_t>{1, 2});
    scale.node.attrs.set("swapped", std::vector<int64_t>{0, 0});
    scale.node.attrs.set("params", std::vector<float>(4, 0.0f));
    expectTacticMatchesReference(scale, "fast");
}

// The vectorized softmax row against softmax computed in double: lengths around the
// 8-float vector, scores over a wide range, -inf (masked) scores, and the rows without a
// finite maximum or with a NaN, which must come out NaN as in the reference.
TEST(FastBackend, SoftmaxRowMatchesDoublePrecision) {
    std::mt19937 rng(8);
    std::uniform_real_distribution<float> score(-60.0f, 20.0f);
    for (int64_t len : {1, 7, 8, 9, 31, 197, 1000}) {
        std::vector<float> x(static_cast<size_t>(len));
        for (auto& v : x) v = score(rng);
        if (len > 2) x[1] = -INFINITY;
        std::vector<float> got = x;
        softmaxRow(got.data(), len);
        double mx = -INFINITY, sum = 0;
        for (float v : x) mx = std::max(mx, static_cast<double>(v));
        for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
        for (int64_t j = 0; j < len; ++j) {
            if (std::isinf(x[j])) continue;  // the masked score: checked below
            const double shifted = static_cast<double>(x[j]) - mx, want = std::exp(shifted) / sum;
            // x - max rounds to float first (as in the reference): relative error ~ |x - max| ulp.
            EXPECT_NEAR(got[j], want, want * (1e-6 + 1.2e-7 * std::fabs(shifted)) + 1e-37) << "len " << len << " element " << j;
        }
        if (len > 2) {
            EXPECT_EQ(got[1], 0.0f);
        }
    }
    for (bool nan : {false, true}) {
        std::vector<float> row(13, nan ? 0.5f : -INFINITY);
        if (nan) row[5] = NAN;
        softmaxRow(row.data(), 13);
        for (float v : row) EXPECT_TRUE(std::isnan(v)) << (nan ? "a NaN score" : "all scores -inf");
    }
}

TEST(FastBackend, PoolAndTransposeTacticsMatchReference) {
    std::mt19937 rng(17);
    for (int64_t ceil : {0, 1})
        for (const auto& [k, s, p] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 3, 0}}) {
            Case c{node("MaxPool"), {randomTensor({2, 3, 9, 10}, rng)}};
            c.node.attrs.set("kernel_shape", std::vector<int64_t>{k, k});
            c.node.attrs.set("strides", std::vector<int64_t>{s, s});
            c.node.attrs.set("pads", std::vector<int64_t>{p, p, p, p});
            c.node.attrs.set("ceil_mode", ceil);
            expectTacticMatchesReference(c, "fast");
        }
    // AveragePool: asymmetric pads, padding counted in the divisor or not, ceil windows that
    // reach past the padded image.
    for (int64_t ceil : {0, 1})
        for (int64_t include : {0, 1})
            for (const auto& [k, s, pads] : std::vector<std::tuple<int64_t, int64_t, std::vector<int64_t>>>{
                     {3, 1, {1, 1, 1, 1}}, {3, 2, {0, 1, 2, 0}}, {2, 2, {0, 0, 0, 0}}, {5, 3, {2, 2, 1, 1}}}) {
                Case c{node("AveragePool"), {randomTensor({2, 3, 9, 10}, rng)}};
                c.node.attrs.set("kernel_shape", std::vector<int64_t>{k, k});
                c.node.attrs.set("strides", std::vector<int64_t>{s, s});
                c.node.attrs.set("pads", pads);
                c.node.attrs.set("ceil_mode", ceil);
                c.node.attrs.set("count_include_pad", include);
                expectTacticMatchesReference(c, "fast");
            }
    // The 2x2/s2 fast path (rows of 8 outputs vectorized, the rest scalar) and odd sizes.
    for (const Dims& dims : {Dims{2, 3, 8, 8}, Dims{2, 3, 9, 11}, Dims{2, 3, 6, 41}}) {
        Case c{node("MaxPool"), {randomTensor(dims, rng)}};
        c.node.attrs.set("kernel_shape", std::vector<int64_t>{2, 2});
        c.node.attrs.set("strides", std::vector<int64_t>{2, 2});
        expectTacticMatchesReference(c, "fast");
    }
    Case gap{node("GlobalAveragePool"), {randomTensor({2, 5, 7, 9}, rng)}};
    expectTacticMatchesReference(gap, "fast");
    for (const auto& perm : std::vector<std::vector<int64_t>>{{0, 2, 1, 3}, {0, 2, 3, 1}, {3, 2, 1, 0}, {1, 0}}) {
        Case c{node("Transpose"), {randomTensor(perm.size() == 2 ? Dims{5, 7} : Dims{2, 3, 4, 5}, rng)}};
        c.node.attrs.set("perm", perm);
        expectTacticMatchesReference(c, "fast");
    }
    for (const auto& [dims, perm] : std::vector<std::pair<Dims, std::vector<int64_t>>>{
             {{1, 5, 1, 7}, {3, 1, 0, 2}}, {{2, 1, 6}, {1, 0, 2}}, {{3, 4, 5, 6}, {0, 3, 1, 2}}}) {  // unit axes, merged runs
        Case c{node("Transpose"), {randomTensor(dims, rng)}};
        c.node.attrs.set("perm", perm);
        expectTacticMatchesReference(c, "fast");
    }
    for (const Dims& dims : {Dims{2, 37, 70}, Dims{3, 2, 64, 33}}) {  // swapping the last two axes: whole and partial 32 x 32 tiles
        Case c{node("Transpose"), {randomTensor(dims, rng)}};
        std::vector<int64_t> perm(dims.size());
        for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
        std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
        c.node.attrs.set("perm", perm);
        expectTacticMatchesReference(c, "fast");
    }
    for (const char* op : {"Gelu", "Relu", "Sigmoid", "Tanh", "Erf", "HardSwish", "LeakyRelu"}) {
        Case act{node(op), {randomTensor({3, 5000}, rng, -4, 4)}};
        expectTacticMatchesReference(act, "fast");
    }
    for (const char* op : {"Tanh", "Erf", "Gelu", "Sigmoid"}) {  // past the approximations' clamps
        Case wide{node(op), {randomTensor({4, 4000}, rng, -20, 20)}};
        expectTacticMatchesReference(wide, "fast");
    }
    Case gelu_tanh{node("Gelu"), {randomTensor({7, 9}, rng, -4, 4)}};
    gelu_tanh.node.attrs.set("approximate", std::string("tanh"));
    expectTacticMatchesReference(gelu_tanh, "fast");
    Case chain{node("ElementwiseChain", "kiln"), {randomTensor({4, 6}, rng, 0.5, 2)}};
    chain.node.attrs.set("ops", std::vector<std::string>{"Erf", "Exp", "Sqrt", "Reciprocal", "Neg", "Abs", "Log"});
    chain.node.attrs.set("operand", std::vector<int64_t>(7, -1));
    chain.node.attrs.set("swapped", std::vector<int64_t>(7, 0));
    chain.node.attrs.set("params", std::vector<float>(14, 0.0f));
    expectTacticMatchesReference(chain, "fast");
    // The polynomial exp over its whole range (sigmoid saturating both ways, exp near its
    // overflow and underflow), and SiLU in a chain.
    Case exps{node("ElementwiseChain", "kiln"), {randomTensor({4, 3000}, rng, -87, 88)}};
    exps.node.attrs.set("ops", std::vector<std::string>{"Exp"});
    exps.node.attrs.set("operand", std::vector<int64_t>{-1});
    exps.node.attrs.set("swapped", std::vector<int64_t>{0});
    exps.node.attrs.set("params", std::vector<float>(2, 0.0f));
    expectTacticMatchesReference(exps, "fast");
    Case silu = exps;
    silu.inputs = {randomTensor({4, 3000}, rng, -100, 100)};
    silu.node.attrs.set("ops", std::vector<std::string>{"Silu"});
    expectTacticMatchesReference(silu, "fast");
}

// ConvTranspose on oneDNN's deconvolution: strides, asymmetric pads, output_padding,
// output_shape, dilation, groups, with and without bias, 2-D and 3-D.
TEST(FastBackend, DeconvTacticMatchesReference) {
    bool dnnl = false;
    for (const auto& t : fastTactics()) dnnl |= t.name == "dnnl" && std::find(t.ops.begin(), t.ops.end(), "ConvTranspose") != t.ops.end();
    if (!dnnl) GTEST_SKIP() << "built without oneDNN: no dnnl ConvTranspose tactic";
    std::mt19937 rng(42);
    struct D {
        Dims x, w;
        std::vector<int64_t> strides, pads, output_padding, dilations, output_shape;
        int64_t group;
        bool bias;
    };
    const std::vector<D> cases = {
        {{1, 8, 5, 6}, {8, 4, 2, 2}, {2, 2}, {0, 0, 0, 0}, {}, {}, {}, 1, true},  // a U-Net's 2x upsampling
        {{2, 6, 4, 5}, {6, 3, 3, 3}, {2, 2}, {1, 0, 1, 1}, {1, 0}, {}, {}, 1, false},
        {{1, 6, 5, 5}, {6, 2, 3, 3}, {1, 1}, {1, 1, 1, 1}, {}, {2, 2}, {}, 3, true},
        {{1, 4, 3, 4}, {4, 5, 4, 4}, {2, 2}, {}, {}, {}, {7, 9}, 1, true},
        {{1, 3, 3, 4, 4}, {3, 2, 2, 2, 2}, {2, 2, 2}, {0, 0, 0, 0, 0, 0}, {}, {}, {}, 1, true},
    };
    for (const D& d : cases) {
        Case c{node("ConvTranspose"), {randomTensor(d.x, rng), randomTensor(d.w, rng), d.bias ? randomTensor({d.w[1] * d.group}, rng) : Tensor{}}};
        c.node.attrs.set("strides", d.strides);
        if (!d.pads.empty()) c.node.attrs.set("pads", d.pads);
        if (!d.output_padding.empty()) c.node.attrs.set("output_padding", d.output_padding);
        if (!d.dilations.empty()) c.node.attrs.set("dilations", d.dilations);
        if (!d.output_shape.empty()) c.node.attrs.set("output_shape", d.output_shape);
        c.node.attrs.set("group", d.group);
        expectTacticMatchesReference(c, "dnnl");
    }
}

// Resize over the last two axes, by scales and by sizes, in every mode and the coordinate
// modes exporters use; a resize of an outer axis falls back to the reference.
TEST(FastBackend, ResizeMatchesReference) {
    std::mt19937 rng(41);
    struct R {
        const char *mode, *coord, *nearest;
        std::vector<float> scales;
        std::vector<int64_t> sizes;
        int64_t exclude_outside = 0;
    };
    const std::vector<R> cases = {
        {"nearest", "asymmetric", "floor", {1, 1, 2, 2}, {}},  // torch's nearest upsampling
        {"nearest", "half_pixel", "round_prefer_floor", {1, 1, 1.5f, 0.75f}, {}},
        {"nearest", "tf_half_pixel_for_nn", "round_prefer_ceil", {}, {2, 3, 13, 5}},
        {"linear", "half_pixel", "", {1, 1, 2, 2}, {}},
        {"linear", "pytorch_half_pixel", "", {}, {2, 3, 1, 17}},  // one output row
        {"linear", "align_corners", "", {}, {2, 3, 16, 20}},
        {"linear", "asymmetric", "", {1, 1, 0.5f, 0.5f}, {}},
        {"cubic", "half_pixel", "", {1, 1, 2, 2}, {}},
        {"cubic", "align_corners", "", {}, {2, 3, 11, 9}, 1},
        {"linear", "half_pixel", "", {1, 2, 2, 2}, {}},  // the channel axis too: reference
    };
    for (const R& r : cases) {
        SCOPED_TRACE(std::string(r.mode) + " " + r.coord);
        Case c{node("Resize"), {randomTensor({2, 3, 7, 9}, rng), Tensor{}, Tensor{}, Tensor{}}};
        c.node.attrs.set("mode", std::string(r.mode));
        c.node.attrs.set("coordinate_transformation_mode", std::string(r.coord));
        if (*r.nearest) c.node.attrs.set("nearest_mode", std::string(r.nearest));
        c.node.attrs.set("exclude_outside", r.exclude_outside);
        if (!r.scales.empty()) c.inputs[2] = Tensor::fromVector<float>({4}, r.scales);
        else c.inputs[3] = Tensor::fromVector<int64_t>({4}, r.sizes);
        expectTacticMatchesReference(c, "fast");
    }
}

TEST(FastBackend, EveryTacticParameterListsReferenceAndAuto) {
    for (const auto& p : tacticParameters()) {
        EXPECT_EQ(p.default_value, "auto") << p.name;
        EXPECT_NE(std::find(p.values.begin(), p.values.end(), "reference"), p.values.end()) << p.name;
    }
    Node conv = node("Conv");
    EXPECT_THROW(kernelForTactic(conv, "nonsense"), Error);
}

// NaN handling follows the reference kernels: a NaN anywhere in a MaxPool window gives NaN
// (as PyTorch does), Clip keeps NaN (as ONNX says).
TEST(FastBackend, NanHandlingMatchesReference) {
    std::mt19937 rng(5);
    for (const Dims& dims : {Dims{1, 2, 8, 8}, Dims{1, 2, 9, 7}, Dims{1, 2, 4, 40}}) {
        Tensor x = randomTensor(dims, rng);
        const int64_t W = dims[3];
        x.data<float>()[3] = NAN;      // second element of a 2x2 window
        x.data<float>()[W + 16] = NAN;  // first element of a window's second row
        Node n = node("MaxPool");
        n.attrs.set("kernel_shape", std::vector<int64_t>{2, 2});
        n.attrs.set("strides", std::vector<int64_t>{2, 2});
        const Tactic* fast = nullptr;
        for (const auto& t : fastTactics())
            if (t.name == "fast" && std::find(t.ops.begin(), t.ops.end(), "MaxPool") != t.ops.end()) fast = &t;
        ASSERT_NE(fast, nullptr);
        KernelContext ctx{n, {&x}, 17, nullptr};
        const Tensor want = referenceKernels().find("MaxPool")(ctx)[0], got = fast->kernel(ctx)[0];
        ASSERT_EQ(got.dims(), want.dims());
        int nans = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
            const float g = got.data<float>()[i], w = want.data<float>()[i];
            nans += std::isnan(w);
            EXPECT_TRUE((std::isnan(g) && std::isnan(w)) || g == w) << i << ": " << g << " vs " << w;
        }
        EXPECT_EQ(nans, 2);  // both windows that hold a NaN
    }
    // The direct conv's in-register Relu/Clip: NaN as the reference activations treat it.
    for (const char* act : {"Relu", "Clip"}) {
        Tensor x = randomTensor({1, 2, 6, 20}, rng), w = randomTensor({4, 2, 3, 3}, rng);
        x.data<float>()[27] = NAN;
        Node n = node("FusedConv", "kiln");
        n.attrs.set("pads", std::vector<int64_t>{1, 1, 1, 1});
        n.attrs.set("activation", std::string(act));
        n.attrs.set("activation_params", std::vector<float>{0.f, 6.f});
        const Tactic* direct = nullptr;
        for (const auto& t : fastTactics())
            if (t.name == "direct") direct = &t;
        if (!direct) continue;  // no AVX2 here
        KernelContext ctx{n, {&x, &w}, 17, nullptr};
        const Tensor want = referenceKernels().find("FusedConv")(ctx)[0], got = direct->kernel(ctx)[0];
        int nans = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
            const float g = got.data<float>()[i], r = want.data<float>()[i];
            nans += std::isnan(r);
            EXPECT_TRUE((std::isnan(g) && std::isnan(r)) || std::abs(g - r) < 1e-5f) << act << " " << i << ": " << g << " vs " << r;
        }
        EXPECT_EQ(nans > 0, std::string(act) == "Clip") << act;
    }
    const Activation clip{ActKind::Clip, 0.f, 6.f};
    EXPECT_TRUE(std::isnan(activate(clip, NAN)));
    EXPECT_EQ(activate(clip, -1.f), 0.f);
    EXPECT_EQ(activate(clip, 7.f), 6.f);
    EXPECT_EQ(activate(clip, 2.5f), 2.5f);
}
