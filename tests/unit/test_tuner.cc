#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "test_helpers.h"
#include "tuner/tuner.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
TunerOptions options(const std::string& expr, const std::string& cache) {
    TunerOptions o;
    o.model_path = std::string(KILN_SOURCE_DIR) + "/models/mlp/model.onnx";
    o.golden_dir = std::string(KILN_SOURCE_DIR) + "/models/mlp/test_data_set_0";
    o.expr = expr;
    o.cache_path = cache;
    o.policy.iterations = 3;
    o.policy.warmup = 1;
    o.policy.timeout_s = 3;
    o.rounds = 1;
    return o;
}

std::vector<std::string> cacheLines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
}
}  // namespace

TEST(Tuner, CrashHangBuildErrorAndWrongNumbersAreRecordedAndTheSearchGoesOn) {
    TempDir dir;
    TuneResult r = tune(options("debug.fault=[none,build_error,crash,hang,wrong]", (dir / "cache.jsonl").string()));
    std::map<std::string, std::string> by_fault;
    for (const auto& c : r.candidates) by_fault[BuildRoute::parse(c.route, Builder::space()).get("debug.fault")] = outcomeName(c.outcome);
    EXPECT_EQ(by_fault["none"], "ok");
    EXPECT_EQ(by_fault["build_error"], "build_error");
    EXPECT_EQ(by_fault["crash"], "crash");
    EXPECT_EQ(by_fault["hang"], "timeout");
    EXPECT_EQ(by_fault["wrong"], "accuracy_fail");
    // The wrong-numbers candidate is never ranked: the default wins.
    EXPECT_EQ(BuildRoute::parse(r.best_route, Builder::space()).get("debug.fault"), "none");
    for (const auto& f : r.finalists) EXPECT_NE(f.route.find("debug.fault=none"), std::string::npos);
    // Accuracy failures are cached as such, with their measured error.
    bool saw_accuracy_line = false;
    for (const auto& l : cacheLines((dir / "cache.jsonl").string()))
        if (l.find("\"accuracy_fail\"") != std::string::npos) saw_accuracy_line = l.find("\"error\":0.5") != std::string::npos;
    EXPECT_TRUE(saw_accuracy_line);
}

TEST(Tuner, ContinueSkipsCachedCandidatesAndFinishesTheSearch) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string();
    const std::string expr = "fusion.gemm_bias_act=[on,off] debug.fault=[none,wrong,build_error]";
    TunerOptions first = options(expr, cache);
    first.budget = 3;  // an interrupted search
    TuneResult partial = tune(first);
    EXPECT_EQ(cacheLines(cache).size(), 3u);
    TunerOptions resumed = options(expr, cache);
    resumed.resume = true;
    TuneResult done = tune(resumed);
    EXPECT_EQ(done.from_cache, 3u);
    const auto lines = cacheLines(cache);
    EXPECT_EQ(lines.size(), done.candidates.size());  // nothing measured twice
    std::set<std::string> hashes;
    for (const auto& c : done.candidates) hashes.insert(c.route_hash);
    EXPECT_EQ(hashes.size(), done.candidates.size());
    TuneResult fresh = tune(options(expr, (dir / "other.jsonl").string()));
    EXPECT_EQ(fresh.candidates.size(), done.candidates.size());
    // Only fault-free routes are accurate; the chosen route never carries a fault.
    EXPECT_EQ(BuildRoute::parse(done.best_route, Builder::space()).get("debug.fault"), "none");
    EXPECT_EQ(BuildRoute::parse(fresh.best_route, Builder::space()).get("debug.fault"), "none");
}

TEST(Tuner, ForeignAndCorruptCacheLinesAreSkippedWithWarnings) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string();
    writeFile(cache, "{not json\n{\"model_hash\":\"other\",\"target\":\"x\",\"kiln_version\":\"0\",\"route_hash\":\"h\",\"route\":\"\",\"outcome\":\"ok\"}\n");
    TunerOptions o = options("default", cache);
    o.resume = true;
    TuneResult r = tune(o);
    ASSERT_EQ(r.warnings.size(), 2u);
    EXPECT_NE(r.warnings[0].find("corrupt"), std::string::npos);
    EXPECT_NE(r.warnings[1].find("another model"), std::string::npos);
    EXPECT_EQ(r.candidates.size(), 1u);
}

TEST(Tuner, ToleranceParsing) {
    EXPECT_EQ(Tolerance::parse("cosine=0.999").metric, "cosine");
    EXPECT_THROW(Tolerance::parse("top1=1"), Error);
    EXPECT_THROW(Tolerance::parse("rel-l2"), Error);
    EXPECT_THROW(Tolerance::parse("rel-l2=abc"), Error);
}
