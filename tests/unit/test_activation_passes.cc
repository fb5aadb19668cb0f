// Activation fusions: GELU and HardSwish as exporters spell them out become one node, and
// the blocked layout keeps a division by a constant inside a blocked chain.
#include <gtest/gtest.h>

#include <cmath>

#include "pass_test_helpers.h"
#include "passes/pass.h"

using namespace kiln;
using namespace kiln::testing;

TEST(Passes, GeluErfAndTanhFormsFuse) {
    for (bool erf : {true, false}) {
        Graph g = withInput({3, 5});
        scalar(g, "half", 0.5f);
        scalar(g, "one", 1.0f);
        if (erf) {
            scalar(g, "sqrt2", std::sqrt(2.0f));
            g.nodes = {Node{"d", "Div", "", {"x", "sqrt2"}, {"a"}, {}}, Node{"e", "Erf", "", {"a"}, {"b"}, {}}};
        } else {
            scalar(g, "three", 3.0f);
            scalar(g, "c", 0.044715f);
            scalar(g, "k", std::sqrt(2.0f / static_cast<float>(M_PI)));
            g.nodes = {Node{"p", "Pow", "", {"x", "three"}, {"x3"}, {}}, Node{"m", "Mul", "", {"x3", "c"}, {"cx3"}, {}},
                       Node{"s", "Add", "", {"x", "cx3"}, {"in"}, {}}, Node{"k", "Mul", "", {"in", "k"}, {"a"}, {}},
                       Node{"e", "Tanh", "", {"a"}, {"b"}, {}}};
        }
        g.nodes.push_back(Node{"h", "Mul", "", {"x", "half"}, {"xh"}, {}});
        g.nodes.push_back(Node{"o", "Add", "", {"b", "one"}, {"b1"}, {}});
        g.nodes.push_back(Node{"y", "Mul", "", {"xh", "b1"}, {"y"}, {}});
        g.outputs = {{"y", DType::F32, {}}};
        topologicalSort(g);
        Graph after = g;
        geluFusionPass().run(after, defaults());
        ASSERT_EQ(opTypes(after), std::vector<std::string>{"Gelu"}) << erf;
        EXPECT_EQ(after.nodes[0].attrs.getString("approximate", ""), erf ? "none" : "tanh");
        expectSameOutputs(g, after, {3, 5});
    }
}

// HardSwish in its spelled-out forms: x * relu6(x + 3) / 6 with the division before or after
// the product and as a multiplication by 1/6, Clip's bounds as inputs (opset 11+) or
// attributes, and x * HardSigmoid(x, 1/6, 0.5). A near miss (Clip to 5) stays as it is.
TEST(Passes, HardSwishFormsFuse) {
    for (int form = 0; form < 5; ++form) {
        Graph g = withInput({2, 3, 4, 5});
        scalar(g, "three", 3.0f);
        scalar(g, "zero", 0.0f);
        scalar(g, "six", form == 4 ? 5.0f : 6.0f);
        scalar(g, "sixth", 1.0f / 6.0f);
        Node clip{"c", "Clip", "", {"a", "zero", "six"}, {"r"}, {}};
        if (form == 2) {
            g.opset = 9;
            clip.inputs = {"a"};
            clip.attrs.set("min", 0.0f);
            clip.attrs.set("max", 6.0f);
        }
        g.nodes = {Node{"add", "Add", "", {"three", "x"}, {"a"}, {}}, clip};
        scalar(g, "div6", 6.0f);
        if (form == 0 || form == 4) g.nodes.insert(g.nodes.end(), {Node{"m", "Mul", "", {"x", "r"}, {"p"}, {}}, Node{"d", "Div", "", {"p", "div6"}, {"y"}, {}}});
        if (form == 1) g.nodes.insert(g.nodes.end(), {Node{"d", "Div", "", {"r", "div6"}, {"q"}, {}}, Node{"m", "Mul", "", {"q", "x"}, {"y"}, {}}});
        if (form == 2) g.nodes.insert(g.nodes.end(), {Node{"m", "Mul", "", {"r", "x"}, {"p"}, {}}, Node{"d", "Mul", "", {"sixth", "p"}, {"y"}, {}}});
        if (form == 3) {
            Attributes a;
            a.set("alpha", 1.0f / 6.0f);
            a.set("beta", 0.5f);
            g.nodes = {Node{"hs", "HardSigmoid", "", {"x"}, {"s"}, a}, Node{"m", "Mul", "", {"x", "s"}, {"y"}, {}}};
        }
        g.outputs = {{"y", DType::F32, {}}};
        topologicalSort(g);
        Graph after = g;
        hardSwishFusionPass().run(after, defaults());
        deadCodeEliminationPass().run(after, defaults());
        if (form == 4) {
            EXPECT_EQ(after.nodes.size(), g.nodes.size()) << "Clip(0, 5) is not relu6";
            continue;
        }
        ASSERT_EQ(opTypes(after), std::vector<std::string>{"HardSwish"}) << form;
        EXPECT_EQ(after.nodes[0].inputs, std::vector<std::string>{"x"});
        expectSameOutputs(g, after, {2, 3, 4, 5});
    }
}

// A conv's output divided by a constant without zeros stays in the blocked layout (the chain
// after the conv runs there); a division by a constant with a zero, or of a constant by the
// map, would turn the zero lanes past the last channel into inf or NaN, and leaves it.
TEST(Passes, BlockedChainsKeepDivisionByNonzeroConstants) {
    for (int divisor = 0; divisor < 3; ++divisor) {
        Graph g = withInput({1, 20, 6, 6});
        std::mt19937 rng(5);
        g.initializers["w"] = randomTensor({20, 20, 3, 3}, rng);
        g.initializers["w2"] = randomTensor({20, 20, 1, 1}, rng);
        Tensor d = randomTensor({1, 20, 1, 1}, rng, 1.0f, 2.0f);
        if (divisor == 2) d.data<float>()[3] = 0.0f;
        g.initializers["d"] = divisor == 0 ? Tensor::scalar<float>(6.0f) : d;
        Attributes pads;
        pads.set("pads", std::vector<int64_t>{1, 1, 1, 1});
        g.nodes = {Node{"conv", "Conv", "", {"x", "w"}, {"c"}, pads}, Node{"div", "Div", "", {"c", "d"}, {"q"}, {}}, Node{"conv2", "Conv", "", {"q", "w2"}, {"y"}, {}}};
        g.outputs = {{"y", DType::F32, {}}};
        RouteValues route = defaults();
        route["layout.conv"] = "nchw8c";
        Graph after = g;
        layoutAssignmentPass().run(after, route);
        topologicalSort(after);
        bool div_blocked = false;
        for (const auto& n : after.nodes)
            if (n.op_type == "Div" && n.inputs[0].find("_nchw8c") != std::string::npos) div_blocked = true;
        EXPECT_EQ(div_blocked, divisor < 2) << "divisor form " << divisor;
        expectSameOutputs(g, after, {1, 20, 6, 6}, 1e-5);
    }
}
