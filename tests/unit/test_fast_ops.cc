// Fast CPU tactics other than GEMM and convolution (norms, attention, elementwise chains,
// pooling, transposes, resize, deconvolution, recurrences) against the reference kernels.
#include <gtest/gtest.h>

#include "backends/cpu/fast/epilogue.h"
#include "backends/cpu/fast/softmax_row.h"
#include "backends/cpu/fast/tactics.h"
#include "backends/cpu/reference/channel_blocks.h"
#include "runtime/accuracy.h"
#include "fast_tactic_case.h"

using namespace kiln;
using namespace kiln::testing;

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
        // Blocked per-channel operands over rows of 200 runs (tiles of runs, a partial one last).
        {{2, 3, 20, 10, 8}, {1, 3, 1, 1, 8}}, {{1, 3, 1, 1, 8}, {2, 3, 20, 10, 8}},
    };
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"})
        for (const auto& [a, b] : shapes) {
            const bool pow = std::string(op) == "Pow";
            Case c{node(op), {randomTensor(a, rng, pow ? 0.5 : -2, 2), randomTensor(b, rng, pow ? -1.5 : 0.5, 2)}};
            expectTacticMatchesReference(c, "fast");
        }
    // Squares take their own loop: exactly powf's, negative bases and extremes included.
    Tensor base = randomTensor({3, 700}, rng, -1e19f, 1e19f);
    base.data<float>()[0] = -0.0f, base.data<float>()[1] = 1e-30f, base.data<float>()[2] = -3.0f;
    Case square{node("Pow"), {base, Tensor::scalar<float>(2.0f)}};
    expectTacticMatchesReference(square, "fast");
}

// ElementwiseChain operands that broadcast into the chain's input: per-channel scale and
// shift on NCHW and on a blocked layout, a scalar, a trailing vector, and a large input.
TEST(FastBackend, ChainBroadcastOperandsMatchReference) {
    std::mt19937 rng(13);
    for (const Dims& x : {Dims{2, 16, 9, 9}, Dims{1, 4, 7, 7, 16}, Dims{1, 96, 30, 30}, Dims{2, 3, 20, 10, 8}}) {
        const bool blocked = x.size() == 5;
        const Dims channel = blocked ? Dims{1, x[1], 1, 1, x[4]} : Dims{x[1], 1, 1};
        const Dims batch_channel = blocked ? Dims{1, x[1], 1, 1, x[4]} : Dims{x[0], x[1], 1, 1};
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
    // DenseNet's pre-activation on a blocked map with a residual beside it: periodic,
    // contiguous and one-value operands in one tile.
    Case pre{node("ElementwiseChain", "kiln"),
             {randomTensor({2, 3, 20, 10, 8}, rng), randomTensor({1, 3, 1, 1, 8}, rng), randomTensor({2, 3, 20, 10, 8}, rng), randomTensor({1}, rng)}};
    pre.node.attrs.set("ops", std::vector<std::string>{"Mul", "Add", "Relu", "Sub", "Max"});
    pre.node.attrs.set("operand", std::vector<int64_t>{1, 2, -1, 1, 3});
    pre.node.attrs.set("swapped", std::vector<int64_t>{0, 0, 0, 1, 0});
    pre.node.attrs.set("params", std::vector<float>(10, 0.0f));
    expectTacticMatchesReference(pre, "fast");
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
    // Swapping the last two axes: whole and partial 32 x 32 tiles, 8 x 8 register blocks with
    // and without ragged edges.
    for (const Dims& dims : {Dims{2, 37, 70}, Dims{3, 2, 64, 33}, Dims{1, 48, 136}, Dims{2, 40, 24}}) {
        Case c{node("Transpose"), {randomTensor(dims, rng)}};
        std::vector<int64_t> perm(dims.size());
        for (size_t d = 0; d < perm.size(); ++d) perm[d] = static_cast<int64_t>(d);
        std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
        c.node.attrs.set("perm", perm);
        expectTacticMatchesReference(c, "fast");
    }
    // Other element sizes (quantized models' uint8, int64 indices, f16) on each path: tiles,
    // rows and gathers.
    for (const DType t : {DType::U8, DType::I8, DType::F16, DType::I64}) {
        for (const auto& [dims, perm] : std::vector<std::pair<Dims, std::vector<int64_t>>>{
                 {{2, 37, 70}, {0, 2, 1}}, {{2, 3, 4, 5}, {0, 2, 1, 3}}, {{3, 4, 5, 6}, {3, 1, 0, 2}}}) {
            Tensor x(t, dims);
            std::uniform_int_distribution<int> v(0, 120);
            for (int64_t i = 0; i < x.numel(); ++i) std::memset(x.raw() + i * dtypeSize(t), v(rng), dtypeSize(t));
            Case c{node("Transpose"), {x}};
            c.node.attrs.set("perm", perm);
            const Tensor got = kernelForTactic(c.node, "fast")(KernelContext{c.node, {&c.inputs[0]}, 17, nullptr})[0];
            const Tensor want = referenceKernels().find("Transpose")(KernelContext{c.node, {&c.inputs[0]}, 17, nullptr})[0];
            ASSERT_EQ(got.dims(), want.dims());
            EXPECT_EQ(std::memcmp(got.raw(), want.raw(), want.byteSize()), 0) << dtypeName(t) << " " << dimsToString(dims);
        }
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
    // The vectorized Log, Sqrt, Neg, Abs, Reciprocal and HardSigmoid, one op per chain, over
    // magnitudes from denormals to 3e38 and the special values, element by element against
    // libm: within 2 ulp, and NaN, +-inf and -0 where libm gives them.
    {
        Tensor x(DType::F32, {2, 1500});
        std::uniform_real_distribution<float> exponent(-44, 38.5f), unit(0, 1);
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = (i % 7 == 0 ? -1.f : 1.f) * std::pow(10.f, exponent(rng)) * (1 + unit(rng));
        const float specials[] = {0.f, -0.f, 1.f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), std::numeric_limits<float>::max(), 0.70710677f, 0.70710683f};
        for (size_t k = 0; k < std::size(specials); ++k) x.data<float>()[k * 97] = specials[k];
        for (const char* op : {"Log", "Sqrt", "Neg", "Abs", "Reciprocal", "HardSigmoid"}) {
            Case one{node("ElementwiseChain", "kiln"), {x}};
            one.node.attrs.set("ops", std::vector<std::string>{op});
            one.node.attrs.set("operand", std::vector<int64_t>{-1});
            one.node.attrs.set("swapped", std::vector<int64_t>{0});
            one.node.attrs.set("params", std::vector<float>{0.2f, 0.5f});
            std::vector<const Tensor*> in{&one.inputs[0]};
            const Tensor got = kernelForTactic(one.node, "fast")(KernelContext{one.node, in, 17, nullptr})[0];
            const Tensor want = referenceKernels().find("ElementwiseChain")(KernelContext{one.node, in, 17, nullptr})[0];
            for (int64_t i = 0; i < x.numel(); ++i) {
                const float g = got.data<float>()[i], w = want.data<float>()[i];
                if (std::isnan(w) || std::isinf(w) || w == 0) {
                    EXPECT_TRUE(std::isnan(w) ? std::isnan(g) : g == w && std::signbit(g) == std::signbit(w)) << op << "(" << x.data<float>()[i] << ") = " << g << ", libm " << w;
                    continue;
                }
                EXPECT_LE(std::fabs(g - w), 2 * (std::nextafter(std::fabs(w), INFINITY) - std::fabs(w))) << op << "(" << x.data<float>()[i] << ") = " << g << ", libm " << w;
            }
        }
    }
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

TEST(FastBackend, LogSoftmaxMatchesReference) {
    std::mt19937 rng(41);
    Case c{node("LogSoftmax"), {randomTensor({3, 5, 40}, rng, -8, 8)}};
    expectTacticMatchesReference(c, "fast");
    Case wide{node("LogSoftmax"), {randomTensor({2, 3000}, rng, -30, 30)}};
    expectTacticMatchesReference(wide, "fast");
}

// The BLAS recurrence against the reference's triple loops, over the options that change
// the recurrence: directions, batch-major layout, ragged sequence lengths, initial states,
// peepholes, clip, coupled gates, GRU's linear_before_reset and non-default activations.
TEST(FastBackend, RecurrentTacticMatchesReference) {
    std::mt19937 rng(42);
    const int64_t S = 7, B = 3, I = 5, H = 6;
    for (const char* op : {"LSTM", "GRU", "RNN"}) {
        const int64_t G = std::string(op) == "LSTM" ? 4 : std::string(op) == "GRU" ? 3 : 1;
        for (int variant = 0; variant < 4; ++variant) {
            const std::string direction = variant == 0 ? "forward" : variant == 1 ? "reverse" : "bidirectional";
            const int64_t D = direction == "bidirectional" ? 2 : 1;
            const bool batch_major = variant == 3;
            Case c{node(op), {randomTensor(batch_major ? Dims{B, S, I} : Dims{S, B, I}, rng), randomTensor({D, G * H, I}, rng), randomTensor({D, G * H, H}, rng),
                              randomTensor({D, 2 * G * H}, rng)}};
            c.node.outputs = {"y", "y_h"};
            c.node.attrs.set("direction", direction);
            c.node.attrs.set("hidden_size", H);
            if (batch_major) c.node.attrs.set("layout", int64_t{1});
            c.inputs.push_back(Tensor::fromVector<int32_t>({B}, {static_cast<int32_t>(S), 3, 0}));
            c.inputs.push_back(randomTensor(batch_major ? Dims{B, D, H} : Dims{D, B, H}, rng));
            if (G == 4) {
                c.node.outputs.push_back("y_c");
                c.inputs.push_back(randomTensor(batch_major ? Dims{B, D, H} : Dims{D, B, H}, rng));
                c.inputs.push_back(randomTensor({D, 3 * H}, rng));
                if (variant == 1) c.node.attrs.set("input_forget", int64_t{1});
            }
            if (G == 3) c.node.attrs.set("linear_before_reset", int64_t{variant % 2});
            if (variant == 2) c.node.attrs.set("clip", 0.7f);
            if (variant == 3) {
                std::vector<std::string> acts = G == 4 ? std::vector<std::string>{"HardSigmoid", "Tanh", "Softsign"} : G == 3 ? std::vector<std::string>{"Sigmoid", "LeakyRelu"} : std::vector<std::string>{"Relu"};
                c.node.attrs.set("activations", acts);
                c.node.attrs.set("activation_alpha", std::vector<float>{0.3f, 0.1f});
            }
            SCOPED_TRACE(std::string(op) + " " + direction + (batch_major ? " batch-major" : ""));
            expectTacticMatchesReference(c, "blas");
        }
    }
}

// The standard cells exporters write (default activations, full-length rows) take the
// vectorized, threaded recurrence: against the reference over directions, layouts, batch
// sizes, hidden sizes that do and do not split into whole vectors, GRU's two reset forms,
// and 1, 2 and 4 threads (one direction split among threads, directions side by side, in turn).
TEST(FastBackend, StandardRecurrentCellsMatchReferenceOnEveryThreadCount) {
    std::mt19937 rng(44);
    const int previous = cpuThreads();
    for (int threads : {1, 2, 4}) {
        setCpuThreads(threads);
        for (const char* op : {"LSTM", "GRU"}) {
            const int64_t G = std::string(op) == "LSTM" ? 4 : 3;
            for (int variant = 0; variant < 6; ++variant) {
                // Variants 4 and 5 are large enough (64k multiply-adds a step) to be shared among threads.
                const int64_t S = 9, B = variant >= 4 ? 4 : variant % 2 ? 3 : 1, I = 7, H = variant < 3 ? 21 : variant == 3 ? 40 : 130;
                const std::string direction = variant % 3 == 0 ? "forward" : variant % 3 == 1 ? "reverse" : "bidirectional";
                const int64_t D = direction == "bidirectional" ? 2 : 1;
                const bool batch_major = variant == 4;
                Case c{node(op), {randomTensor(batch_major ? Dims{B, S, I} : Dims{S, B, I}, rng), randomTensor({D, G * H, I}, rng, -0.5f, 0.5f),
                                  randomTensor({D, G * H, H}, rng, -0.5f, 0.5f), randomTensor({D, 2 * G * H}, rng)}};
                c.node.outputs = {"y", "y_h"};
                c.node.attrs.set("direction", direction);
                c.node.attrs.set("hidden_size", H);
                if (batch_major) c.node.attrs.set("layout", int64_t{1});
                c.inputs.push_back(variant == 5 ? Tensor::fromVector<int32_t>({B}, std::vector<int32_t>(static_cast<size_t>(B), static_cast<int32_t>(S))) : Tensor());
                c.inputs.push_back(randomTensor(batch_major ? Dims{B, D, H} : Dims{D, B, H}, rng));
                if (G == 4) {
                    c.node.outputs.push_back("y_c");
                    c.inputs.push_back(randomTensor(batch_major ? Dims{B, D, H} : Dims{D, B, H}, rng));
                } else {
                    c.node.attrs.set("linear_before_reset", int64_t{variant % 2});
                }
                if (variant == 3) c.node.attrs.set("activations", G == 4 ? std::vector<std::string>{"sigmoid", "tanh", "tanh"} : std::vector<std::string>{"Sigmoid", "Tanh"});
                SCOPED_TRACE(std::string(op) + " " + direction + (batch_major ? " batch-major" : "") + " B " + std::to_string(B) + " H " + std::to_string(H) +
                             " threads " + std::to_string(threads));
                expectTacticMatchesReference(c, "blas");
            }
        }
    }
    setCpuThreads(previous);
}

// The recurrence's arithmetic, not only its two product implementations: a one-step,
// one-unit LSTM and GRU worked by hand.
TEST(FastBackend, RecurrentStepMatchesHandComputedGates) {
    auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
    const float x = 0.5f, h0 = -0.25f, c0 = 0.75f;
    {
        // Gates i, o, f, c: W rows (0.1, 0.2, 0.3, 0.4), R rows (0.5, -0.5, 1, -1), no bias.
        Node n = node("LSTM");
        n.outputs = {"y", "y_h", "y_c"};
        n.attrs.set("hidden_size", int64_t{1});
        const Tensor X = Tensor::fromVector<float>({1, 1, 1}, {x}), W = Tensor::fromVector<float>({1, 4, 1}, {0.1f, 0.2f, 0.3f, 0.4f}),
                     R = Tensor::fromVector<float>({1, 4, 1}, {0.5f, -0.5f, 1.0f, -1.0f}), H0 = Tensor::fromVector<float>({1, 1, 1}, {h0}),
                     C0 = Tensor::fromVector<float>({1, 1, 1}, {c0});
        const auto out = referenceKernels().find("LSTM")(KernelContext{n, {&X, &W, &R, nullptr, nullptr, &H0, &C0}, 17, nullptr});
        const double i = sigmoid(0.1 * x + 0.5 * h0), o = sigmoid(0.2 * x - 0.5 * h0), f = sigmoid(0.3 * x + 1.0 * h0), g = std::tanh(0.4 * x - 1.0 * h0);
        const double c = f * c0 + i * g, h = o * std::tanh(c);
        EXPECT_NEAR(out[2].data<float>()[0], c, 1e-6);
        EXPECT_NEAR(out[1].data<float>()[0], h, 1e-6);
        EXPECT_NEAR(out[0].data<float>()[0], h, 1e-6);
    }
    {
        // Gates z, r, h with W (0.1, 0.2, 0.3), R (0.5, -0.5, 2), bias Rb on h = 0.25.
        Node n = node("GRU");
        n.outputs = {"y", "y_h"};
        n.attrs.set("hidden_size", int64_t{1});
        const Tensor X = Tensor::fromVector<float>({1, 1, 1}, {x}), W = Tensor::fromVector<float>({1, 3, 1}, {0.1f, 0.2f, 0.3f}),
                     R = Tensor::fromVector<float>({1, 3, 1}, {0.5f, -0.5f, 2.0f}), Bias = Tensor::fromVector<float>({1, 6}, {0, 0, 0, 0, 0, 0.25f}),
                     H0 = Tensor::fromVector<float>({1, 1, 1}, {h0});
        for (int64_t lbr : {0, 1}) {
            n.attrs.set("linear_before_reset", lbr);
            const auto out = referenceKernels().find("GRU")(KernelContext{n, {&X, &W, &R, &Bias, nullptr, &H0}, 17, nullptr});
            const double z = sigmoid(0.1 * x + 0.5 * h0), r = sigmoid(0.2 * x - 0.5 * h0);
            const double cand = lbr ? std::tanh(0.3 * x + r * (2.0 * h0 + 0.25)) : std::tanh(0.3 * x + 2.0 * (r * h0) + 0.25);
            EXPECT_NEAR(out[1].data<float>()[0], (1 - z) * cand + z * h0, 1e-6) << "linear_before_reset " << lbr;
        }
    }
}
