// Fast CPU GEMM and convolution tactics (plain and channel-blocked) against the reference
// kernels of the same nodes.
#include <gtest/gtest.h>

#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/softmax_row.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/channel_blocks.h"
#include "runtime/accuracy.h"
#include "fast_tactic_case.h"

using namespace kiln;
using namespace kiln::testing;

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

// Single rows take Kiln's GEMV: plain and transposed weights, alpha, K not a multiple of its
// four-row step, N past its column chunk, and weights large enough to be split among threads
// (2.4 MB) on 1, 2 and 3 threads.
TEST(FastBackend, SingleRowGemvMatchesReferenceOnEveryThreadCount) {
    std::mt19937 rng(22);
    const int previous = cpuThreads();
    for (int threads : {1, 2, 3})
        for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{7, 3}, {383, 1100}, {1201, 517}})
            for (int64_t tb : {0, 1}) {
                setCpuThreads(threads);
                Case c{node("Gemm"), {randomTensor({1, K}, rng), randomTensor(tb ? Dims{N, K} : Dims{K, N}, rng), randomTensor({N}, rng)}};
                c.node.attrs.set("transB", tb);
                c.node.attrs.set("alpha", 0.7f);
                SCOPED_TRACE("K " + std::to_string(K) + " N " + std::to_string(N) + " transB " + std::to_string(tb) + " threads " + std::to_string(threads));
                for (const auto& t : gemmTacticNames()) expectTacticMatchesReference(c, t);
            }
    setCpuThreads(previous);
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
        int64_t kw = 0, H = 9, W = 11;  // kw 0: a square k x k kernel
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
        {32, 32, 3, 1, 1, 1, 1, 1, 1, 2, "Relu", true, false},  // grouped (gOIhw<b>i<b>o): 16 channels a group
        {64, 32, 3, 2, 1, 1, 1, 1, 1, 4, "none", true, true},   // 16 in, 8 out a group: blocks of 8 only
        // 1 x 33 kernels with 16 pads (wav2vec2's positional conv, smaller): oneDNN has only its
        // reference kernel on blocked data; the conv runs in oneDNN's layouts through reorders.
        {32, 32, 1, 1, 0, 16, 0, 16, 1, 2, "Gelu", true, true, 33, 1, 40},
        {16, 24, 1, 1, 0, 16, 0, 15, 1, 1, "none", false, false, 33, 2, 37},
    };
    std::vector<std::string> tactics = {"reference"};
    for (const auto& t : fastTactics())
        if (t.name == "dnnl" && t.op_class == "conv") tactics.push_back("dnnl");
    for (int64_t block : {8, 16})
        for (const Geo& geo : geos) {
            const bool depthwise = geo.group == geo.c && geo.m == geo.c, grouped = geo.group > 1 && !depthwise;
            if (grouped && ((geo.c / geo.group) % block || (geo.m / geo.group) % block)) continue;
            const int64_t N = 2, H = geo.H, W = geo.W, kw = geo.kw ? geo.kw : geo.k;
            const int64_t OH = (H + geo.pt + geo.pb - (geo.k - 1) * geo.dil - 1) / geo.stride + 1, OW = (W + geo.pl + geo.pr - (kw - 1) * geo.dil - 1) / geo.stride + 1;
            const Tensor x = randomTensor({N, geo.c, H, W}, rng), w = randomTensor({geo.m, geo.c / geo.group, geo.k, kw}, rng);
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
                depthwise ? PackedConvWeights::Goihwg : grouped ? PackedConvWeights::GOIhwIO : geo.c < 8 ? PackedConvWeights::Ohwio : PackedConvWeights::OIhwIO, block);
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
