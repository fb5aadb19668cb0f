// The op-conformance harness for the fast CPU backend: a tactic runs on a node
// configuration and must match the reference kernel of the same node.
#pragma once
#include <gtest/gtest.h>

#include "backends/cpu/fast/tactics.h"
#include "runtime/accuracy.h"
#include "test_helpers.h"

namespace kiln::testing {

struct Case {
    Node node;
    std::vector<Tensor> inputs;  // undefined tensor = omitted input
};

inline void expectTacticMatchesReference(const Case& c, const std::string& tactic_name) {
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

inline Node node(const std::string& op, const std::string& domain = "") { return Node{"n", op, domain, {}, {"y"}, {}}; }


}  // namespace kiln::testing
