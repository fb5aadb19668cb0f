#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "test_helpers.h"
#include "tuner/tuner.h"
#include "tuner_test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
std::vector<std::string> cacheLines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
}

// Cache lines of search candidates (not the finalists' re-measurements).
std::vector<std::string> candidateLines(const std::string& path) {
    std::vector<std::string> out;
    for (const auto& l : cacheLines(path))
        if (l.find("remeasure") == std::string::npos) out.push_back(l);
    return out;
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
    // The fault scales the output by 1.5: a relative L2 error of 0.5 (up to summation order).
    int accuracy_lines = 0;
    for (const auto& l : cacheLines((dir / "cache.jsonl").string())) {
        const auto j = nlohmann::json::parse(l);
        if (j.value("outcome", "") != "accuracy_fail") continue;
        ++accuracy_lines;
        EXPECT_NEAR(j.value("error", 0.0), 0.5, 1e-5) << l;
    }
    EXPECT_EQ(accuracy_lines, 1);
}

TEST(Tuner, ParallelBuildsGiveTheSameOutcomes) {
    TempDir dir;
    TunerOptions o = options("debug.fault=[none,build_error,crash,hang,wrong] opt.dce=[on,off]", (dir / "cache.jsonl").string());
    o.jobs = 3;
    TuneResult r = tune(o);
    ASSERT_EQ(r.candidates.size(), 10u);
    std::map<std::string, int> outcomes;
    for (const auto& c : r.candidates) ++outcomes[outcomeName(c.outcome)];
    EXPECT_EQ(outcomes["ok"], 2);
    EXPECT_EQ(outcomes["build_error"], 2);
    EXPECT_EQ(outcomes["crash"], 2);
    EXPECT_EQ(outcomes["timeout"], 2);
    EXPECT_EQ(outcomes["accuracy_fail"], 2);
    for (const auto& c : r.candidates)
        if (c.outcome == Outcome::Ok) {
            EXPECT_EQ(c.samples_ms.size(), 3u);  // timed after the parallel build
        }
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::temp_directory_path() / ("kiln-tune-" + std::to_string(getpid()))));
}

TEST(Tuner, ContinueSkipsCachedCandidatesAndFinishesTheSearch) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string();
    const std::string expr = "fusion.gemm_bias_act=[on,off] debug.fault=[none,wrong,build_error]";
    TunerOptions first = options(expr, cache);
    first.budget.candidates = 3;  // an interrupted search
    TuneResult partial = tune(first);
    EXPECT_EQ(candidateLines(cache).size(), 3u);
    TunerOptions resumed = options(expr, cache);
    resumed.resume = true;
    TuneResult done = tune(resumed);
    EXPECT_EQ(done.from_cache, 3u);
    EXPECT_EQ(candidateLines(cache).size(), done.candidates.size());  // nothing measured twice
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
    ASSERT_GE(r.warnings.size(), 2u);  // a loaded machine adds its noise warnings after these
    EXPECT_NE(r.warnings[0].find("corrupt"), std::string::npos);
    EXPECT_NE(r.warnings[1].find("another model"), std::string::npos);
    EXPECT_EQ(r.candidates.size(), 1u);
}

// Deterministic stand-in for build-and-measure: latency from the route hash, a fault-free
// route with fusion.gemm_bias_act=off fails accuracy. Re-measurements vary per call count.
CandidateResult fakeMeasure(const BuildRoute& route, int* calls) {
    CandidateResult r;
    r.route = route.text();
    r.route_hash = route.hash();
    ++*calls;
    if (route.get("fusion.gemm_bias_act") == "off" && route.get("opt.cse") == "off") {
        r.outcome = Outcome::AccuracyFail;
        r.error = 0.25;
        return r;
    }
    r.outcome = Outcome::Ok;
    const double base = 1.0 + static_cast<double>(std::stoull(r.route_hash.substr(0, 6), nullptr, 16) % 1000) / 1000.0;
    r.samples_ms = {base, base * 1.01, base * 0.99};
    summarizeSamples(r);
    return r;
}

TEST(Tuner, InterruptedAndResumedSearchEndsWithTheUninterruptedResult) {
    TempDir dir;
    const std::string expr = "fusion.gemm_bias_act=[on,off] opt.cse=[on,off] opt.dce=[on,off] memory.planner=*";
    for (Strategy strategy : {Strategy::Exhaustive, Strategy::Mixed, Strategy::Greedy}) {
        int calls = 0;
        TunerOptions whole = options(expr, (dir / (strategyName(strategy) + "-whole.jsonl")).string());
        whole.strategy = strategy;
        whole.evaluate_override = [&](const BuildRoute& r) { return fakeMeasure(r, &calls); };
        TuneResult uninterrupted = tune(whole);
        ASSERT_GT(uninterrupted.candidates.size(), 3u);
        for (size_t stop_after : {size_t{1}, uninterrupted.candidates.size() / 2, uninterrupted.candidates.size() - 1}) {
            const std::string cache = (dir / (strategyName(strategy) + std::to_string(stop_after) + ".jsonl")).string();
            TunerOptions first = whole;
            first.cache_path = cache;
            first.budget.candidates = stop_after;  // interrupted after `stop_after` candidates
            tune(first);
            calls = 0;
            TunerOptions resumed = whole;
            resumed.cache_path = cache;
            resumed.resume = true;
            TuneResult again = tune(resumed);
            ASSERT_EQ(again.candidates.size(), uninterrupted.candidates.size()) << strategyName(strategy);
            for (size_t i = 0; i < again.candidates.size(); ++i) EXPECT_EQ(again.candidates[i].route_hash, uninterrupted.candidates[i].route_hash);
            EXPECT_EQ(again.best_route, uninterrupted.best_route) << strategyName(strategy);
            EXPECT_GE(again.from_cache, stop_after);
            // No candidate measured twice: the cache holds each search candidate once.
            std::set<std::string> keys;
            for (const auto& l : cacheLines(cache)) EXPECT_TRUE(keys.insert(l.substr(l.find("\"route_hash\""), 60)).second) << l;
        }
    }
}

// Routes whose parameters do nothing to the model build the default's engine: they are
// validated, not timed, and tie with it by construction, so noise cannot make one of them
// win (it did: quant.skip_first_last=on without int8 "won" a CI run). Of the routes that
// share another engine, the one with the fewest changes stands for them. With parallel
// builds too, and again from the cache.
TEST(Tuner, RoutesThatBuildOneEngineAreTimedOnceAndTieToTheSimplest) {
    for (size_t jobs : {1, 2}) {
        TempDir dir;
        TunerOptions o = options("quant.skip_first_last=[off,on] tactic.cpu.conv=[auto,direct] memory.planner=[greedy,none]", (dir / "c.jsonl").string());
        o.jobs = jobs;
        for (bool resumed : {false, true}) {
            o.resume = resumed;
            const TuneResult r = tune(o);
            ASSERT_EQ(r.candidates.size(), 8u);
            const std::string def = BuildRoute::defaults(Builder::space()).hash();
            std::map<std::string, std::string> timed;  // engine identity -> the route hash timed for it
            for (const auto& c : r.candidates) {
                ASSERT_EQ(c.outcome, Outcome::Ok) << c.message;
                ASSERT_FALSE(c.engine_id.empty());
                const bool none = BuildRoute::parse(c.route, Builder::space()).get("memory.planner") == "none";
                if (c.same_engine_as.empty()) {
                    EXPECT_TRUE(timed.emplace(c.engine_id, c.route_hash).second) << "a second timing of one engine: " << c.route;
                } else {
                    EXPECT_EQ(timed.at(c.engine_id), c.same_engine_as) << c.route;
                    auto twin = std::find_if(r.candidates.begin(), r.candidates.end(), [&](const auto& k) { return k.route_hash == c.same_engine_as; });
                    ASSERT_NE(twin, r.candidates.end());
                    EXPECT_EQ(c.samples_ms, twin->samples_ms) << c.route;
                    EXPECT_NE(c.message.find("same engine as"), std::string::npos) << c.message;
                }
                if (!none) EXPECT_EQ(c.engine_id, r.candidates[0].engine_id) << c.route;
            }
            EXPECT_EQ(timed.size(), 2u) << "jobs " << jobs;  // the default's engine and the one without a memory plan
            EXPECT_EQ(r.candidates[0].route_hash, def);
            for (const auto& f : r.finalists) {
                const BuildRoute route = BuildRoute::parse(f.route, Builder::space());
                EXPECT_EQ(route.get("quant.skip_first_last"), "off") << f.route;
                EXPECT_EQ(route.get("tactic.cpu.conv"), "auto") << f.route;
            }
            const std::string best = BuildRoute::parse(r.best_route, Builder::space()).changesText(Builder::space());
            EXPECT_TRUE(best == "default" || best == "memory.planner=none") << best;
        }
    }
}

TEST(Tuner, ReportsInEveryFormat) {
    TempDir dir;
    TunerOptions o = options("fusion.gemm_bias_act=[on,off] debug.fault=[none,wrong]", "");
    TuneResult r = tune(o);
    for (const char* name : {"r.json", "r.md", "r.html"}) {
        writeTuneReport(r, o, (dir / name).string());
        const std::string text = readFile(dir / name);
        EXPECT_NE(text.find("kiln build"), std::string::npos) << name;  // the rebuild command
        EXPECT_NE(text.find("accuracy_fail"), std::string::npos) << name;
    }
    EXPECT_NE(readFile(dir / "r.html").find("<svg"), std::string::npos);
    EXPECT_THROW(writeTuneReport(r, o, (dir / "r.txt").string()), Error);
    EXPECT_FALSE(r.effects.empty());
}

TEST(Tuner, BudgetParsing) {
    EXPECT_EQ(Budget::parse("40").candidates, 40u);
    EXPECT_EQ(Budget::parse("10m").seconds, 600.0);
    EXPECT_EQ(Budget::parse("90s").seconds, 90.0);
    EXPECT_THROW(Budget::parse("ten"), Error);
    EXPECT_THROW(Budget::parse("5d"), Error);
}

TEST(Tuner, ToleranceParsing) {
    EXPECT_EQ(Tolerance::parse("cosine=0.999").metric, "cosine");
    EXPECT_THROW(Tolerance::parse("top1=1"), Error);
    EXPECT_THROW(Tolerance::parse("top-k=0.5"), Error);
    AccuracyCriterion c = AccuracyCriterion::parse({"max-abs=0.1", "logits:top-k=5"});
    EXPECT_EQ(c.forOutput("logits").metric, "top-k");
    EXPECT_EQ(c.forOutput("other").metric, "max-abs");
    // top-k: row 0 agrees on top-1, row 1's top-1 (index 2) is third in the golden row.
    Tensor want = Tensor::fromVector<float>({2, 3}, {0.1f, 0.9f, 0.2f, 0.5f, 0.4f, 0.3f});
    Tensor got = Tensor::fromVector<float>({2, 3}, {0.0f, 1.0f, 0.5f, 0.1f, 0.2f, 0.9f});
    EXPECT_DOUBLE_EQ(c.forOutput("logits").measure(got, want, "logits"), 1.0);  // within top-5
    EXPECT_DOUBLE_EQ(Tolerance::parse("top-k=2").measure(got, want, "y"), 0.5);
    EXPECT_THROW(Tolerance::parse("rel-l2"), Error);
    EXPECT_THROW(Tolerance::parse("rel-l2=abc"), Error);
}
