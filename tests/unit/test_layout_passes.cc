// Layout passes: chains of convs in channel-blocked layouts (NCHW8c/16c with packed weights),
// against the plain reference.
#include <gtest/gtest.h>

#include <algorithm>

#include "backends/cpu/reference/channel_blocks.h"
#include "engine/builder.h"
#include "passes/pass.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

#include "pass_test_helpers.h"

// layout.conv=nchw8c and nchw16c: a CNN's convs and pools run channel-blocked, entering through no
// BlockChannels node (the first conv reads its 3-channel NCHW input directly) and leaving
// only where a plain node or a graph output reads a value. The optimized graph on the
// reference kernels and as an engine (dnnl conv tactic, fast reorders and pools) gives the
// unoptimized graph's outputs; layout.conv=nchw, and auto on the GPU target, block nothing.
TEST(Passes, ChannelBlockedConvChainsMatchTheReference) {
    std::mt19937 rng(12);
    Graph g = withInput({2, 3, 13, 11});
    auto attrs = [](std::vector<std::pair<std::string, std::vector<int64_t>>> ints) {
        Attributes a;
        for (auto& [k, v] : ints) a.set(k, v);
        return a;
    };
    g.initializers["w1"] = randomTensor({12, 3, 3, 3}, rng);
    g.initializers["b1"] = randomTensor({12}, rng);
    g.initializers["w2"] = randomTensor({12, 1, 3, 3}, rng);
    g.initializers["w3"] = randomTensor({20, 12, 1, 1}, rng);
    g.initializers["b3"] = randomTensor({20}, rng);
    g.initializers["w4"] = randomTensor({20, 12, 1, 1}, rng);
    g.initializers["w5"] = randomTensor({16, 20, 3, 3}, rng);
    Attributes dw = attrs({{"pads", {1, 1, 1, 1}}, {"strides", {2, 2}}});
    dw.set("group", int64_t{12});
    Attributes avg = attrs({{"kernel_shape", {2, 2}}, {"pads", {1, 1, 0, 0}}});
    g.nodes = {Node{"c1", "Conv", "", {"x", "w1", "b1"}, {"c1"}, attrs({{"pads", {1, 1, 1, 1}}})},
               Node{"r1", "Relu", "", {"c1"}, {"r1"}, {}},
               Node{"c2", "Conv", "", {"r1", "w2"}, {"c2"}, dw},  // depthwise, 7x6 out
               Node{"c3", "Conv", "", {"c2", "w3", "b3"}, {"c3"}, {}},
               Node{"c4", "Conv", "", {"c2", "w4"}, {"c4"}, {}},
               Node{"add", "Add", "", {"c3", "c4"}, {"a"}, {}},  // joins c3 or c4 as its residual
               Node{"mp", "MaxPool", "", {"a"}, {"m"}, attrs({{"kernel_shape", {3, 3}}, {"strides", {2, 2}}, {"pads", {1, 1, 1, 1}}})},
               Node{"c5", "Conv", "", {"m", "w5"}, {"c5"}, attrs({{"pads", {2, 2, 2, 2}}, {"dilations", {2, 2}}})},
               Node{"gap", "GlobalAveragePool", "", {"c5"}, {"y1"}, {}},
               Node{"tanh", "Tanh", "", {"c2"}, {"y2"}, {}},  // a plain reader of a blocked value
               Node{"avg", "AveragePool", "", {"c5"}, {"y3"}, avg}};
    g.value_info["c3"] = {"c3", DType::F32, Shape::fromDims({2, 20, 7, 6})};
    g.value_info["c4"] = {"c4", DType::F32, Shape::fromDims({2, 20, 7, 6})};
    g.outputs = {{"y1", DType::F32, {}}, {"y2", DType::F32, {}}, {"y3", DType::F32, {}}};
    for (int64_t block : {8, 16}) {
        BuildRoute route = BuildRoute::parse("layout.conv=nchw" + std::to_string(block) + "c", Builder::space());
        const Graph after = optimizeGraph(g, route.values());
        std::map<std::string, int> count;
        for (const auto& n : after.nodes) {
            ++count[n.op_type];
            if (n.op_type == "FusedConv") EXPECT_EQ(n.attrs.getString("data_layout", ""), blockedDataLayout(block)) << n.name;
            if (n.op_type == "FusedConv") EXPECT_EQ(packedConvWeightBlock(n.attrs.getString("weight_layout", "")), block) << n.name;
        }
        EXPECT_EQ(count["FusedConv"], 5);
        EXPECT_EQ(count["BlockedPool"], 3);
        EXPECT_EQ(count["BlockChannels"], 0);
        EXPECT_EQ(count["UnblockChannels"], 3);  // y1, y3 and Tanh's input
        expectSameOutputs(g, after, {2, 3, 13, 11});
        TensorMap in = {{"x", randomTensor({2, 3, 13, 11}, rng)}};
        const auto want = GraphExecutor(g).run(in);
        Builder b(g, "");
        b.setBuildRoute(route);
        Engine e = b.build();
        ExecutionContext ctx(e);
        ctx.run(in);
        const auto got = ctx.run(in);  // in the planned arena
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(compareOutputs(got[i], want[i], "y").rel_l2, 1e-5) << i << " block " << block;
    }
    RouteValues nchw = BuildRoute::parse("layout.conv=nchw", Builder::space()).values(), cuda = defaults();
    cuda[kTargetKey] = "cuda";
    for (const RouteValues& values : {nchw, cuda})
        for (const auto& n : optimizeGraph(g, values).nodes) EXPECT_NE(n.op_type, "BlockedPool") << routeValue(values, "layout.conv");
}

// Grouped convs stay in a blocked chain when each group's channels are whole blocks: 16
// channels a group fit blocks of 8 and 16, 8 a group only blocks of 8 (the chain is then
// left and entered again around it).
TEST(Passes, GroupedConvsStayBlocked) {
    std::mt19937 rng(13);
    Graph g = withInput({1, 32, 9, 9});
    g.initializers["w1"] = randomTensor({32, 16, 3, 3}, rng);  // 2 groups of 16
    g.initializers["w2"] = randomTensor({32, 8, 3, 3}, rng);   // 4 groups of 8
    g.initializers["w4"] = randomTensor({32, 4, 3, 3}, rng);   // 8 groups of 4
    g.initializers["w3"] = randomTensor({32, 32, 1, 1}, rng);
    g.initializers["b"] = randomTensor({32}, rng);
    auto conv = [](int64_t group) {
        Attributes a;
        a.set("pads", std::vector<int64_t>{1, 1, 1, 1});
        a.set("group", group);
        return a;
    };
    g.nodes = {Node{"c1", "Conv", "", {"x", "w1", "b"}, {"c1"}, conv(2)}, Node{"r1", "Relu", "", {"c1"}, {"r1"}, {}},
               Node{"c2", "Conv", "", {"r1", "w2", "b"}, {"c2"}, conv(4)}, Node{"c4", "Conv", "", {"c2", "w4"}, {"c4"}, conv(8)},
               Node{"c3", "Conv", "", {"c4", "w3"}, {"y"}, {}}};
    g.outputs = {{"y", DType::F32, {}}};
    for (int64_t block : {8, 16}) {
        const RouteValues route = BuildRoute::parse("layout.conv=nchw" + std::to_string(block) + "c", Builder::space()).values();
        const Graph after = optimizeGraph(g, route);
        std::map<std::string, std::string> weight_layout;
        for (const auto& n : after.nodes)
            if (n.op_type == "FusedConv") weight_layout[n.attrs.getInt("group", 1) == 1 ? "dense" : "g" + std::to_string(n.attrs.getInt("group", 1))] = n.attrs.getString("weight_layout", "");
        const std::string b = std::to_string(block);
        EXPECT_EQ(weight_layout["g2"], "gOIhw" + b + "i" + b + "o");
        // Groups smaller than a block keep plain weights; oneDNN reorders around them.
        EXPECT_EQ(weight_layout["g4"], block == 8 ? "gOIhw8i8o" : "goihw16");
        EXPECT_EQ(weight_layout["g8"], "goihw" + b);
        const auto ops = opTypes(after);
        EXPECT_EQ(std::count(ops.begin(), ops.end(), "UnblockChannels"), 1) << "block " << block << ": the chain breaks";
        expectSameOutputs(g, after, {1, 32, 9, 9});
        Builder builder(g, "");
        builder.setBuildRoute(BuildRoute::parse("layout.conv=nchw" + b + "c", Builder::space()));
        const Engine e = builder.build();
        TensorMap in = {{"x", randomTensor({1, 32, 9, 9}, rng)}};
        EXPECT_LT(compareOutputs(ExecutionContext(e).run(in)[0], GraphExecutor(g).run(in)[0], "y").rel_l2, 1e-5) << "block " << block;
    }
}

