#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "backends/cpu/cpu_features.h"
#include "engine/builder.h"
#include "backends/cpu/tactic_selection.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "runtime/accuracy.h"
#include "runtime/context.h"
#include "backends/memory_plan.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
const std::string kModels = std::string(KILN_SOURCE_DIR) + "/models";

Engine buildModel(const std::string& name, const std::string& route = "") {
    Builder b(importOnnxModel(kModels + "/" + name + "/model.onnx"), modelFileHash(kModels + "/" + name + "/model.onnx"));
    b.setBuildRoute(BuildRoute::parse(route, Builder::space()));
    return b.build();
}
TensorMap inputsOf(const std::string& name) { return {{"x", loadTensorFile(kModels + "/" + name + "/test_data_set_0/input_0.pb")}}; }

uint64_t fnv(const std::string& s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) {
        h ^= static_cast<unsigned char>(s[i]);
        h *= 1099511628211ull;
    }
    return h;
}
}  // namespace

TEST(EngineFile, SaveLoadRunIsBitExact) {
    for (const std::string model : {"mlp", "small_cnn", "transformer_block"}) {
        Engine e = buildModel(model, "precision.matmul=f16");
        std::string bytes = serializeEngine(e);
        Engine back = deserializeEngine(bytes, "mem", targetSignature("cpu"));
        EXPECT_EQ(back.route, e.route);
        EXPECT_EQ(serializeEngine(back), bytes);  // stable re-serialization
        auto a = ExecutionContext(e).run(inputsOf(model)), b = ExecutionContext(back).run(inputsOf(model));
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
            ASSERT_EQ(a[i].byteSize(), b[i].byteSize());
            EXPECT_EQ(std::memcmp(a[i].raw(), b[i].raw(), a[i].byteSize()), 0) << model;
        }
    }
}

TEST(EngineFile, EveryFlippedByteIsDetected) {
    const std::string bytes = serializeEngine(buildModel("small_cnn"));
    const size_t step = std::max<size_t>(1, bytes.size() / 400);
    for (size_t pos = 0; pos < bytes.size(); pos += step) {
        std::string bad = bytes;
        bad[pos] = static_cast<char>(bad[pos] ^ 0x5a);
        EXPECT_THROW(deserializeEngine(bad, "flipped", ""), Error) << "byte " << pos;
    }
    for (size_t len : {size_t{0}, size_t{7}, size_t{30}, bytes.size() / 2, bytes.size() - 1}) EXPECT_THROW(deserializeEngine(bytes.substr(0, len), "cut", ""), Error);
}

TEST(EngineFile, RandomMutationsWithValidChecksumNeverCrash) {
    const std::string bytes = serializeEngine(buildModel("mlp"));
    std::mt19937 rng(77);
    int rejected = 0;
    for (int trial = 0; trial < 300; ++trial) {
        std::string bad = bytes;
        const size_t payload_end = bad.size() - 8;
        for (int k = 0; k < 1 + trial % 4; ++k) bad[24 + rng() % (payload_end - 24)] = static_cast<char>(rng());
        uint64_t h = fnv(bad, payload_end);
        std::memcpy(bad.data() + payload_end, &h, 8);  // re-seal so the parser itself is exercised
        try {
            deserializeEngine(bad, "mutated", "");
        } catch (const Error&) {
            ++rejected;
        }
    }
    EXPECT_GT(rejected, 0);
}

TEST(EngineFile, NewerFormatAndOtherTargetAreRefused) {
    std::string bytes = serializeEngine(buildModel("mlp"));
    std::string newer = bytes;
    newer[8] = static_cast<char>(kEngineFormatVersion + 1);
    try {
        deserializeEngine(newer, "e", "");
        FAIL();
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("newer than this Kiln supports"), std::string::npos);
    }
    try {
        deserializeEngine(bytes, "e", "cuda/sm_90");
        FAIL();
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("built for target"), std::string::npos);
    }
    EXPECT_THROW(deserializeEngine("not an engine at all, definitely", "e", ""), Error);
}

TEST(MemoryPlan, LiveBuffersNeverOverlapAndReuseSavesMemory) {
    std::mt19937 rng(5);
    for (const std::string strategy : {"none", "greedy", "linear"}) {
        std::vector<BufferRequest> req;
        for (int i = 0; i < 60; ++i) {
            size_t first = rng() % 50;
            req.push_back({first, first + rng() % 6, 64 + rng() % 5000});
        }
        MemoryPlan plan = planMemory(req, strategy);
        for (size_t a = 0; a < req.size(); ++a)
            for (size_t b = a + 1; b < req.size(); ++b) {
                bool live = req[a].first_use <= req[b].last_use && req[b].first_use <= req[a].last_use;
                bool apart = plan.offsets[a] + req[a].bytes <= plan.offsets[b] || plan.offsets[b] + req[b].bytes <= plan.offsets[a];
                EXPECT_TRUE(!live || apart) << strategy;
            }
        if (strategy != "none") {
            EXPECT_LT(plan.arena_bytes, plan.unplanned_bytes);
        }
    }
    EXPECT_THROW(planMemory({}, "bogus"), Error);
}

TEST(ExecutionContext, SeveralThreadsShareOneEngine) {
    Engine e = buildModel("transformer_block");
    TensorMap in = inputsOf("transformer_block");
    const Tensor expected = ExecutionContext(e).run(in)[0];
    std::vector<std::thread> threads;
    std::vector<int> ok(4, 0);
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            ExecutionContext ctx(e);
            bool same = true;
            for (int r = 0; r < 3; ++r) {
                Tensor y = ctx.run(in)[0];
                same &= std::memcmp(y.raw(), expected.raw(), y.byteSize()) == 0;
            }
            ok[t] = same;
        });
    for (auto& th : threads) th.join();
    for (int t = 0; t < 4; ++t) EXPECT_TRUE(ok[t]) << "thread " << t;
}

// A Reshape's output stays a view of its input's planned buffer: that buffer must live
// until the view's last use, though same-sized values are made (and could reuse it) in
// between. Each run (recording, then two on the planned arena) matches the reference.
TEST(ExecutionContext, ViewsKeepTheirInputBufferAlive) {
    Graph g;
    g.opset = 17;
    g.inputs = {{"x", DType::F32, Shape::fromDims({4, 8})}};
    g.initializers["shape"] = Tensor::fromVector<int64_t>({2}, {8, 4});
    g.initializers["back"] = Tensor::fromVector<int64_t>({2}, {4, 8});
    g.nodes = {Node{"relu", "Relu", "", {"x"}, {"a"}, {}},        Node{"view", "Reshape", "", {"a", "shape"}, {"v"}, {}},
               Node{"neg", "Neg", "", {"x"}, {"b1"}, {}},         Node{"exp", "Exp", "", {"b1"}, {"b2"}, {}},
               Node{"abs", "Abs", "", {"b2"}, {"b3"}, {}},        Node{"sin", "Sin", "", {"b3"}, {"b4"}, {}},
               Node{"v2", "Reshape", "", {"v", "back"}, {"w"}, {}}, Node{"add", "Add", "", {"b4", "w"}, {"y"}, {}}};
    g.outputs = {{"y", DType::F32, {}}};
    Builder b(g, "");
    b.setBuildRoute(BuildRoute::parse("opt.reshape_chain=off;fold.constants=off", Builder::space()));
    Engine e = b.build();
    std::mt19937 rng(3);
    TensorMap in{{"x", randomTensor({4, 8}, rng)}};
    const auto want = GraphExecutor(g).run(in);
    ExecutionContext ctx(e);
    for (int run = 0; run < 3; ++run) {
        const auto got = ctx.run(in);
        // A buffer reused too early would garble whole rows; the fast exp differs from the
        // reference's in the last bits only.
        for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(compareOutputs(got[i], want[i], "y").max_abs, 1e-6) << "run " << run << " output " << i;
    }
}

TEST(ExecutionContext, ShapeProfileBoundsInputs) {
    Builder b(importOnnxModel(kModels + "/mlp/model.onnx"), "");
    b.setShapeProfile({{"x", ShapeRange{{1, 64}, {4, 64}, {8, 64}}}});
    Engine e = b.build();
    ExecutionContext ctx(e);
    std::mt19937 rng(1);
    EXPECT_EQ(ctx.run({{"x", randomTensor({8, 64}, rng)}})[0].dims(), (Dims{8, 10}));
    EXPECT_EQ(ctx.run({{"x", randomTensor({2, 64}, rng)}})[0].dims(), (Dims{2, 10}));
    EXPECT_THROW(ctx.run({{"x", randomTensor({9, 64}, rng)}}), Error);
    EXPECT_THROW(b.setShapeProfile({{"nope", ShapeRange{{1}, {1}, {1}}}}), Error);
}

// Each input shape plans its own arena; the stats describe the arena of the last run, also
// when a run returns to the shape before a newly recorded one.
TEST(ExecutionContext, StatsFollowTheArenaOfEachRun) {
    Builder b(importOnnxModel(kModels + "/mlp/model.onnx"), "");
    b.setShapeProfile({{"x", ShapeRange{{1, 64}, {4, 64}, {8, 64}}}});
    Engine e = b.build();
    ExecutionContext ctx(e);
    std::mt19937 rng(2);
    const Tensor big = randomTensor({8, 64}, rng), small = randomTensor({1, 64}, rng);
    ctx.run({{"x", big}});  // records the shape's arena
    ctx.run({{"x", big}});  // runs on it
    const size_t big_bytes = ctx.stats().arena_bytes;
    ctx.run({{"x", small}});
    const size_t small_bytes = ctx.stats().arena_bytes;
    EXPECT_LT(small_bytes, big_bytes);
    ctx.run({{"x", big}});
    EXPECT_EQ(ctx.stats().arena_bytes, big_bytes);
    ctx.run({{"x", small}});
    EXPECT_EQ(ctx.stats().arena_bytes, small_bytes);
}

// small_cnn's batch is symbolic: without a profile its convs cannot be timed (no cache
// entries); with one, they are timed on the values the model computes at the opt shape.
// (NCHW layout: channel-blocked convs have one tactic, so there would be nothing to time.)
TEST(TimingCache, SymbolicShapesAreTimedAtTheProfileShapes) {
    TempDir dir;
    auto timedEntries = [&](bool with_profile) {
        const std::string path = (dir / (with_profile ? "profile.json" : "none.json")).string();
        TimingCache cache(path);
        Builder b(importOnnxModel(kModels + "/small_cnn/model.onnx"), "");
        b.setBuildRoute(BuildRoute::parse("layout.conv=nchw", Builder::space()));
        if (with_profile) b.setShapeProfile({{"x", ShapeRange{{1, 3, 32, 32}, {2, 3, 32, 32}, {4, 3, 32, 32}}}});
        b.setTimingCache(&cache);
        Engine e = b.build();
        cache.save();
        const std::string text = std::filesystem::exists(path) ? readFile(path) : "";
        size_t n = 0;
        for (size_t at = text.find("FusedConv"); at != std::string::npos; at = text.find("FusedConv", at + 1)) ++n;
        // Whatever was picked computes the model's numbers.
        std::mt19937 rng(4);
        const Tensor x = randomTensor({2, 3, 32, 32}, rng);
        ExecutionContext ctx(e);
        Builder ref(importOnnxModel(kModels + "/small_cnn/model.onnx"), "");
        ref.setBuildRoute(BuildRoute::parse("tactic.cpu.conv=reference", Builder::space()));
        Engine re = ref.build();
        ExecutionContext rctx(re);
        EXPECT_LT(compareOutputs(ctx.run({{"x", x}})[0], rctx.run({{"x", x}})[0], "logits").rel_l2, 1e-5);
        return n;
    };
    EXPECT_EQ(timedEntries(false), 0u);
    EXPECT_EQ(timedEntries(true), 2u);  // both convs
}

TEST(TimingCache, SecondBuildReusesTheTimedTactics) {
    TempDir dir;
    const std::string path = (dir / "timing.json").string();
    // MobileNetV2's depthwise convs have two tactics to time in the NCHW layout.
    const BuildRoute nchw = BuildRoute::parse("layout.conv=nchw", Builder::space());
    const std::string mobilenet = std::string(KILN_SHARED_DIR) + "/models/mobilenet_v2/model.onnx";
    if (!std::filesystem::exists(mobilenet)) GTEST_SKIP() << mobilenet << " not present";
    Graph model = importOnnxModel(mobilenet);
    std::map<std::string, std::string> first;
    size_t first_hits = 0;  // identical nodes within one model already share a timing
    {
        TimingCache cache(path);
        Builder b(model, "");
        b.setBuildRoute(nchw);
        b.setTimingCache(&cache);
        first = b.build().tactics;
        cache.save();
        first_hits = cache.hits();
    }
    TimingCache again(path);
    Builder b(model, "");
    b.setBuildRoute(nchw);
    b.setTimingCache(&again);
    EXPECT_EQ(b.build().tactics, first);
    EXPECT_GT(again.hits(), first_hits);  // every timed node now comes from the file
    writeFile(path, "not json");
    EXPECT_THROW(TimingCache{path}, Error);
}

// An engine's identity changes with what decides how it runs (its graph, the kernels chosen
// for it, run-time settings), and not with parameters that do nothing to this model: the
// MLP has no Conv, nothing to quantize and nothing dead to remove.
TEST(EngineIdentity, OnlyWhatChangesTheEngineChangesItsIdentity) {
    const std::string base = Builder::engineIdentity(buildModel("mlp"));
    EXPECT_EQ(base, Builder::engineIdentity(buildModel("mlp")));
    for (const char* same : {"quant.skip_first_last=on", "tactic.cpu.conv=direct", "opt.dce=off", "tactic.cuda.gemm=heuristic"})
        EXPECT_EQ(Builder::engineIdentity(buildModel("mlp", same)), base) << same;
    std::set<std::string> seen = {base};
    for (const char* other : {"memory.planner=none", "fusion.gemm_bias_act=off", "tactic.cpu.gemm=blas"})
        EXPECT_TRUE(seen.insert(Builder::engineIdentity(buildModel("mlp", other))).second) << other;
    // Another model's engine under the same route differs too.
    EXPECT_TRUE(seen.insert(Builder::engineIdentity(buildModel("small_cnn"))).second);
}

// A search offers only the values a build takes as themselves: f16/bf16 on a CPU that has
// them natively, int8 on the CPU only; other parameters keep every value.
TEST(EngineIdentity, OfferedValuesAreTheOnesABuildKeeps) {
    const Graph mlp = importOnnxModel(kModels + "/mlp/model.onnx");
    auto has = [](const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    const Builder cpu(mlp, "", "cpu"), cuda(mlp, "", "cuda");
    const auto matmul = cpu.offeredValues("precision.matmul");
    EXPECT_TRUE(has(matmul, "f32") && has(matmul, "int8"));
    EXPECT_EQ(has(matmul, "f16"), cpuHasNativeF16());
    EXPECT_EQ(has(matmul, "bf16"), cpuHasNativeBf16());
    EXPECT_FALSE(has(cuda.offeredValues("precision.conv"), "int8"));
    EXPECT_EQ(cpu.offeredValues("memory.planner"), Builder::space().get("memory.planner").values);
}
