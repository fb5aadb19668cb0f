#include <gtest/gtest.h>

#include <algorithm>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_features.h"
#include "engine/builder.h"
#include "route/expression.h"

using namespace kiln;

namespace {
const ParameterSpace& space() { return Builder::space(); }
std::string errorOf(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}
}  // namespace

TEST(Space, HasAtLeast25VisibleParametersWithValidDefaults) {
    int visible = 0;
    for (const auto& p : space().parameters()) {
        visible += !p.hidden;
        EXPECT_FALSE(p.description.empty()) << p.name;
        EXPECT_FALSE(p.owner.empty()) << p.name;
    }
    EXPECT_GE(visible, 25);
}

TEST(BuildRoute, CanonicalTextRoundTripsAndHashIsStable) {
    BuildRoute r = BuildRoute::parse("precision.matmul=f16; fusion.gelu=off", space());
    EXPECT_EQ(r.get("precision.matmul"), "f16");
    EXPECT_EQ(r.get("fusion.layernorm"), "on");  // default
    BuildRoute back = BuildRoute::parse(r.text(), space());
    EXPECT_EQ(back, r);
    EXPECT_EQ(back.hash(), r.hash());
    EXPECT_NE(r.hash(), BuildRoute::defaults(space()).hash());
    EXPECT_EQ(r.changesText(space()), "fusion.gelu=off;precision.matmul=f16");
    // Canonical text is sorted by name.
    std::string text = r.text();
    EXPECT_LT(text.find("fusion.gelu"), text.find("precision.matmul"));
    EXPECT_EQ(BuildRoute::defaults(space()).changesText(space()), "default");
}

TEST(BuildRoute, BadNamesAndValuesListTheValidOnes) {
    EXPECT_NE(errorOf([] { BuildRoute::parse("fusion.gelu=maybe", space()); }).find("allowed: on, off"), std::string::npos);
    EXPECT_NE(errorOf([] { BuildRoute::parse("fusion.gelux=on", space()); }).find("fusion.gelu"), std::string::npos);
    EXPECT_NE(errorOf([] { BuildRoute::parse("fusion.gelu", space()); }).find("not a name=value pair"), std::string::npos);
}

TEST(Expression, CrossProductsGlobsAndUnions) {
    auto r = expandRouteExpression("fusion.gelu=[on,off] precision.matmul=[f32,f16,bf16]", space());
    EXPECT_EQ(r.routes.size(), 6u);
    auto all = expandRouteExpression("precision.*=*", space());
    EXPECT_EQ(all.routes.size(), 3456u);  // 4^2 (conv, matmul: f32, f16, bf16, int8) x 3^3 other op classes x 4 activation types x 2 tf32
    auto u = expandRouteExpression("default | fusion.gelu=off | fusion.gelu=on", space());
    EXPECT_EQ(u.generated, 3u);
    EXPECT_EQ(u.routes.size(), 2u);  // fusion.gelu=on is the default: deduplicated
    auto grouped = expandRouteExpression("(fusion.gelu=off | fusion.layernorm=off) precision.conv=[f32,f16]", space());
    EXPECT_EQ(grouped.routes.size(), 4u);
}

TEST(Expression, StrategiesOneAtATimeAndRandom) {
    auto oat = expandRouteExpression("one-at-a-time", space());
    size_t expected = 1;
    for (const auto& p : space().parameters())
        if (!p.hidden) expected += p.values.size() - 1;
    EXPECT_EQ(oat.routes.size(), expected);
    auto limited = expandRouteExpression("fusion.*=[on,off] one-at-a-time", space());
    for (const auto& route : limited.routes) {
        const std::string changes = route.changesText(space());
        EXPECT_LE(std::count(changes.begin(), changes.end(), '='), 1);
    }
    auto rnd = expandRouteExpression("random:10", space(), 42);
    EXPECT_EQ(rnd.routes.size(), 10u);
    auto again = expandRouteExpression("random:10", space(), 42);
    for (size_t i = 0; i < 10; ++i) EXPECT_EQ(rnd.routes[i], again.routes[i]);  // seeded
    auto small = expandRouteExpression("fusion.gelu=[on,off] random:50", space());
    EXPECT_EQ(small.routes.size(), 2u);  // capped at the domain's size
}

TEST(Expression, ParseErrorsPointAtTheColumn) {
    EXPECT_NE(errorOf([] { expandRouteExpression("fusion.gelu=[on,off", space()); }).find("column 20"), std::string::npos);
    EXPECT_NE(errorOf([] { expandRouteExpression("fusion.gelu", space()); }).find("column 12: expected '='"), std::string::npos);
    EXPECT_NE(errorOf([] { expandRouteExpression("random:0", space()); }).find("positive count"), std::string::npos);
    EXPECT_NE(errorOf([] { expandRouteExpression("nothing.*=on", space()); }).find("matches no parameter"), std::string::npos);
    EXPECT_NE(errorOf([] { expandRouteExpression("fusion.gelu=[on,off] | ", space()); }).find("expected a term"), std::string::npos);
    EXPECT_NE(errorOf([] { expandRouteExpression("one-at-a-time random:3", space()); }).find("only one strategy"), std::string::npos);
}

TEST(Expression, HiddenParametersAreNotExpandedByGlobs) {
    EXPECT_NE(errorOf([] { expandRouteExpression("debug.*=*", space()); }).find("matches no parameter"), std::string::npos);
    auto named = expandRouteExpression("debug.fault=[none,wrong]", space());
    EXPECT_EQ(named.routes.size(), 2u);
}

// A reduced CPU precision the machine would only emulate goes back to f32 with a warning;
// one it computes natively stays; the CUDA target's precisions are not the CPU's business.
TEST(BuildRoute, EmulatedCpuPrecisionsStayF32WithAWarning) {
    const BuildRoute asked = BuildRoute::parse("precision.matmul=f16;precision.conv=bf16;precision.attention=f16", Builder::space());
    std::vector<std::string> warnings;
    const BuildRoute kept = keepNativeCpuPrecisions(asked, false, true, &warnings);
    EXPECT_EQ(kept.get("precision.matmul"), "f32");
    EXPECT_EQ(kept.get("precision.attention"), "f32");
    EXPECT_EQ(kept.get("precision.conv"), "bf16");
    ASSERT_EQ(warnings.size(), 2u);
    EXPECT_NE(warnings[0].find("precision.matmul=f16"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find("keeps f32"), std::string::npos) << warnings[0];
    warnings.clear();
    EXPECT_EQ(keepNativeCpuPrecisions(asked, true, true, &warnings), asked);
    EXPECT_TRUE(warnings.empty());
    EXPECT_EQ(keepNativeCpuPrecisions(asked, false, false, &warnings).get("precision.conv"), "f32");

    Graph g;
    g.inputs.push_back({"x", DType::F32, Shape::fromDims({2, 3})});
    g.nodes.push_back(Node{"relu", "Relu", "", {"x"}, {"y"}, {}});
    g.outputs = {{"y", DType::F32, {}}};
    Builder cpu(g, "test", "cpu");
    cpu.setBuildRoute(asked);
    EXPECT_EQ(cpu.getBuildRoute().get("precision.matmul") == "f16", cpuHasNativeF16());
    EXPECT_EQ(cpu.warnings().empty(), cpuHasNativeF16() && cpuHasNativeBf16());
    Builder cuda(g, "test", "cuda");
    cuda.setBuildRoute(asked);
    EXPECT_EQ(cuda.getBuildRoute(), asked);
    EXPECT_TRUE(cuda.warnings().empty());
}

// The registry finds a target by kind or signature and names the known ones otherwise; each
// target says which parameters a precision flag sets there (one flag, every target).
TEST(Backends, RegistryAndPrecisionFlagsPerTarget) {
    EXPECT_EQ(backendFor("cpu").name(), "cpu");
    EXPECT_EQ(backendFor("cuda/sm_90/NVIDIA H200").name(), "cuda");
    EXPECT_EQ(backendNames(), (std::vector<std::string>{"cpu", "cuda", "reference"}));
    try {
        backendFor("tpu");
        ADD_FAILURE() << "an unknown target was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("targets: cpu, cuda or reference"), std::string::npos) << e.what();
    }
    const auto cpu_f16 = backendFor("cpu").precisionParameters("f16");
    EXPECT_NE(std::find(cpu_f16.begin(), cpu_f16.end(), "precision.matmul"), cpu_f16.end());
    EXPECT_EQ(backendFor("cuda").precisionParameters("bf16"), (std::vector<std::string>{"precision.activations"}));
    EXPECT_TRUE(backendFor("cuda").precisionParameters("int8").empty());
    EXPECT_EQ(backendFor("cpu").precisionParameters("int8"), (std::vector<std::string>{"precision.conv", "precision.matmul"}));
    // Every parameter a flag sets exists in the space, with that value allowed.
    for (const auto& target : backendNames())
        for (const char* precision : {"f16", "bf16", "int8"})
            for (const auto& p : backendFor(target).precisionParameters(precision)) {
                const auto& values = Builder::space().get(p).values;
                EXPECT_NE(std::find(values.begin(), values.end(), precision), values.end()) << target << " " << p << "=" << precision;
            }
}
