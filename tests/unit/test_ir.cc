#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ir/graph.h"

using namespace kiln;

TEST(Half, RoundTripsKnownValues) {
    // Reference bit patterns from the IEEE 754 binary16 definition.
    EXPECT_EQ(Half(1.0f).bits, 0x3c00);
    EXPECT_EQ(Half(-2.0f).bits, 0xc000);
    EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
    EXPECT_EQ(Half(1e6f).bits, 0x7c00);                  // overflow -> inf
    EXPECT_EQ(Half(5.9604645e-08f).bits, 0x0001);         // smallest subnormal
    EXPECT_EQ(Half(1.0f + 1.0f / 2048).bits, 0x3c00);     // tie rounds to even
    EXPECT_EQ(Half(1.0f + 3.0f / 2048).bits, 0x3c02);
    EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
}

TEST(Half, ConversionErrorWithinHalfUlp) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> d(-1000.0f, 1000.0f);
    for (int i = 0; i < 10000; ++i) {
        float x = d(rng);
        float back = Half(x);
        float ulp = std::ldexp(1.0f, std::ilogb(x) - 10);
        EXPECT_LE(std::fabs(back - x), ulp / 2) << x;
    }
}

TEST(BFloat16, RoundsToNearestEven) {
    EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
    EXPECT_FLOAT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
    EXPECT_EQ(BFloat16(bitsToFloat(0x3f808000)).bits, 0x3f80);  // tie -> even
    EXPECT_EQ(BFloat16(bitsToFloat(0x3f818000)).bits, 0x3f82);
}

TEST(DType, NamesRoundTrip) {
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64, DType::Bool})
        EXPECT_EQ(parseDType(dtypeName(t)), t);
    EXPECT_THROW(parseDType("f33"), Error);
    EXPECT_EQ(dtypeSize(DType::BF16), 2u);
}

TEST(Shape, BroadcastFollowsNumpy) {
    EXPECT_EQ(broadcastDims({2, 1, 4}, {3, 1}, "t"), (Dims{2, 3, 4}));
    EXPECT_EQ(broadcastDims({}, {5}, "t"), (Dims{5}));
    EXPECT_THROW(broadcastDims({2, 3}, {4}, "t"), Error);
    EXPECT_EQ(stridesOf({2, 3, 4}), (Dims{12, 4, 1}));
    Shape s;
    s.rank_known = true;
    s.dims = {Dim{-1, "batch"}, Dim{3, {}}};
    EXPECT_EQ(s.toString(), "[batch,3]");
    EXPECT_FALSE(s.fullyKnown());
}

TEST(Tensor, ReshapeSharesDataAndChecksCount) {
    Tensor t = Tensor::fromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
    Tensor r = t.reshaped({3, 2});
    r.data<float>()[0] = 42;
    EXPECT_EQ(t.data<float>()[0], 42);
    EXPECT_THROW(t.reshaped({4, 2}), Error);
    EXPECT_THROW(t.data<int32_t>(), Error);
    Tensor c = t.clone();
    c.data<float>()[1] = -1;
    EXPECT_EQ(t.data<float>()[1], 2);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
}

namespace {
Graph chain() {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({2})}};
    g.outputs = {{"z", DType::F32, {}}};
    g.nodes = {Node{"b", "Relu", "", {"y"}, {"z"}, {}}, Node{"a", "Neg", "", {"x"}, {"y"}, {}}};
    return g;
}
}  // namespace

TEST(Graph, TopologicalSortOrdersProducersFirst) {
    Graph g = chain();
    EXPECT_THROW(verifyGraph(g), Error);  // "y" used before it is produced
    topologicalSort(g);
    EXPECT_EQ(g.nodes[0].name, "a");
    EXPECT_NO_THROW(verifyGraph(g));
}

TEST(Graph, VerifierRejectsCyclesUndefinedInputsAndDuplicates) {
    Graph cyc = chain();
    cyc.nodes[1].inputs = {"z"};
    EXPECT_THROW(topologicalSort(cyc), Error);

    Graph undef = chain();
    topologicalSort(undef);
    undef.nodes[0].inputs = {"nope"};
    try {
        verifyGraph(undef);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
    }

    Graph dup = chain();
    topologicalSort(dup);
    dup.nodes[1].outputs = {"y"};
    EXPECT_THROW(verifyGraph(dup), Error);

    Graph missing_out = chain();
    topologicalSort(missing_out);
    missing_out.outputs[0].name = "w";
    EXPECT_THROW(verifyGraph(missing_out), Error);
}

TEST(Graph, VerifierChecksElementTypes) {
    Graph g;
    g.inputs = {{"a", DType::F32, Shape::fromDims({2})}, {"b", DType::I64, Shape::fromDims({2})}};
    g.outputs = {{"c", DType::F32, {}}};
    g.nodes = {Node{"add", "Add", "", {"a", "b"}, {"c"}, {}}};
    EXPECT_THROW(verifyGraph(g), Error);
}

TEST(Graph, DumpIsReadable) {
    Graph g = chain();
    topologicalSort(g);
    g.nodes[0].attrs.set("alpha", 0.5f);
    std::string text = dumpGraph(g);
    EXPECT_NE(text.find("input  x:f32[2]"), std::string::npos) << text;
    EXPECT_NE(text.find("= Neg(x) {alpha=0.5}"), std::string::npos) << text;
}
