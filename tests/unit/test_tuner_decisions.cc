// The tuner's decisions on made-up timings: bootstrap intervals, noise detection, ties to
// the simplest route, effects from re-measured rounds, --verify, and --dry-run's plan.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "onnx_import/importer.h"
#include "tuner/statistics.h"
#include "tuner/tuner.h"
#include "tuner_test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

std::vector<double> normalSamples(double mean, double sd, int n, std::mt19937& rng) {
    std::normal_distribution<double> d(mean, sd);
    std::vector<double> v;
    for (int i = 0; i < n; ++i) v.push_back(d(rng));
    return v;
}

TEST(TunerStatistics, SpeedupIntervalCoversTheTrueRatio) {
    std::mt19937 rng(1);
    RoundSamples base, fast, same;
    for (int r = 0; r < 3; ++r) {
        base.push_back(normalSamples(10, 0.2, 30, rng));
        fast.push_back(normalSamples(8, 0.2, 30, rng));
        same.push_back(normalSamples(10, 0.2, 30, rng));
    }
    const Interval f = speedupInterval(base, fast), s = speedupInterval(base, same);
    EXPECT_NEAR(f.estimate, 1.25, 0.02);
    EXPECT_LT(f.low, 1.25);
    EXPECT_GT(f.high, 1.25);
    EXPECT_GT(f.low, 1.2);
    EXPECT_LT(s.low, 1.0);
    EXPECT_GT(s.high, 1.0);
    // Drift between rounds lands on both: the ratio per round stays 1.25.
    RoundSamples drift_base, drift_fast;
    for (int r = 0; r < 3; ++r) {
        drift_base.push_back(normalSamples(10 * (1 + r), 0.01, 20, rng));
        drift_fast.push_back(normalSamples(8 * (1 + r), 0.01, 20, rng));
    }
    EXPECT_NEAR(speedupInterval(drift_base, drift_fast).estimate, 1.25, 0.01);
    EXPECT_EQ(speedupInterval({{}}, {{1.0}}).low, 0.0);  // nothing to compare: no claim
}

TEST(TunerStatistics, WideAndBimodalSamplesAreNoise) {
    std::mt19937 rng(2);
    EXPECT_EQ(unstableSamples(normalSamples(10, 0.1, 40, rng), 0.5), "");
    EXPECT_NE(unstableSamples(normalSamples(10, 3, 40, rng), 0.5).find("spread"), std::string::npos);
    std::vector<double> bimodal = normalSamples(5, 0.01, 20, rng), slow = normalSamples(5 + 2, 0.01, 30, rng);
    bimodal.insert(bimodal.end(), slow.begin(), slow.end());
    EXPECT_NE(unstableSamples(bimodal, 0.5), "");
    EXPECT_NE(unstableSamples({1, 1, 1, 1, 1, 1, 1, 1, 10, 10}, 0.5), "");
}

// Made-up timings: a route's samples come from `timing(route, call)`, where call counts the
// route's evaluations (0: the search, then re-measurements and fresh builds).
struct FakeTimings {
    std::function<std::vector<double>(const BuildRoute&, int call)> timing;
    std::map<std::string, int> calls;
    CandidateResult operator()(const BuildRoute& route) {
        CandidateResult r;
        r.route = route.text();
        r.route_hash = route.hash();
        r.outcome = Outcome::Ok;
        r.samples_ms = timing(route, calls[r.route_hash]++);
        summarizeSamples(r);
        return r;
    }
};

std::vector<double> around(double ms, uint64_t seed, int n = 20, double sd = 0.005) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    return normalSamples(ms, ms * sd, n, rng);
}

TunerOptions fakeOptions(const std::string& expr, FakeTimings& fake) {
    TunerOptions o = options(expr, "");
    o.rounds = 3;
    o.evaluate_override = [&fake](const BuildRoute& r) { return fake(r); };
    o.machine_load = [] { return std::string(); };  // the made-up timings are the only noise
    return o;
}

// The false win of the issue: a candidate whose search-phase median was 148x lower, whose
// re-measured samples are bimodal. The default is kept, and the noise is named.
TEST(TunerDecisions, BimodalSamplesDoNotMakeAWin) {
    FakeTimings fake;
    fake.timing = [](const BuildRoute& r, int call) {
        if (r.get("memory.planner") != "linear") return around(1.0, call + 1);
        if (call == 0) return around(1.0 / 148, 7);
        std::vector<double> v = around(0.3, call + 11, 10);
        auto slow = around(1.05, call + 31, 10);
        v.insert(v.end(), slow.begin(), slow.end());
        return v;
    };
    TunerOptions o = fakeOptions("memory.planner=*", fake);
    const TuneResult r = tune(o);
    EXPECT_FALSE(r.significant);
    EXPECT_EQ(r.best_route, BuildRoute::defaults(Builder::space()).text());
    EXPECT_FALSE(r.noise.empty());
    ASSERT_FALSE(r.warnings.empty());
    EXPECT_NE(r.warnings.front().find("measuring the finalists again"), std::string::npos);
    EXPECT_EQ(r.speedup, 1.0);
}

// A clear win is taken with its interval; among wins that do not differ significantly, the
// one with the fewest changes; the effects table holds the re-measured numbers.
TEST(TunerDecisions, ClearWinsTieToTheSimplestRoute) {
    FakeTimings fake;
    fake.timing = [](const BuildRoute& r, int call) {
        const bool planner = r.get("memory.planner") == "linear", cse = r.get("opt.cse") == "off";
        double ms = 1.0;
        if (planner) ms = 0.80;
        if (planner && cse) ms = 0.80;  // the same as planner alone, within the noise
        if (!planner && cse) ms = call == 0 ? 0.5 : 1.0;  // a search-phase fluke: no effect when re-measured
        return around(ms, call * 131 + (cse ? 7 : 0) + (planner ? 3 : 0));
    };
    TunerOptions o = fakeOptions("memory.planner=[greedy,linear] opt.cse=[on,off]", fake);
    const TuneResult r = tune(o);
    ASSERT_TRUE(r.significant);
    EXPECT_EQ(BuildRoute::parse(r.best_route, Builder::space()).changesText(Builder::space()), "memory.planner=linear");
    EXPECT_NEAR(r.speedup, 1.25, 0.02);
    EXPECT_LT(r.speedup_interval.low, r.speedup);
    EXPECT_GT(r.speedup_interval.low, 1.2);
    std::map<std::string, double> effect;
    for (const auto& e : r.effects) effect[e.parameter + "=" + e.value] = e.relative_latency;
    ASSERT_EQ(effect.count("opt.cse=off"), 1u);
    EXPECT_NEAR(effect["opt.cse=off"], 1.0, 0.02);  // the re-measured number, not the search's 0.5
    EXPECT_NEAR(effect["memory.planner=linear"], 0.8, 0.02);
}

// --verify rebuilds the winner and the default in fresh processes: a win they confirm holds;
// one they do not is dropped for the default.
TEST(TunerDecisions, VerifyKeepsOnlyWinsThatHold) {
    for (bool holds : {true, false}) {
        FakeTimings fake;
        const int search_and_rounds = 1 + 3;
        fake.timing = [&](const BuildRoute& r, int call) {
            const bool fresh = call >= search_and_rounds;
            const double ms = r.get("memory.planner") == "linear" && (holds || !fresh) ? 0.8 : 1.0;
            return around(ms, call * 17 + ms * 100);
        };
        TunerOptions o = fakeOptions("memory.planner=[greedy,linear]", fake);
        o.verify = 3;
        const TuneResult r = tune(o);
        EXPECT_TRUE(r.verified);
        EXPECT_EQ(r.win_held, holds);
        EXPECT_EQ(r.significant, holds);
        EXPECT_NEAR(r.verification.estimate, holds ? 1.25 : 1.0, 0.02);
        EXPECT_EQ(fake.calls[BuildRoute::parse("memory.planner=linear", Builder::space()).hash()], search_and_rounds + 3);
    }
}

// --dry-run's plan is what the run builds: every route for exhaustive, in order; phase 1 for
// mixed.
TEST(TunerDecisions, DryRunPlanIsWhatTheRunBuilds) {
    FakeTimings fake;
    fake.timing = [](const BuildRoute&, int call) { return around(1.0, call + 5); };
    for (const char* strategy : {"exhaustive", "mixed"}) {
        TunerOptions o = fakeOptions("memory.planner=* opt.cse=[on,off]", fake);
        o.strategy = parseStrategy(strategy);
        const TunePlan plan = planTune(o, importOnnxModel(o.model_path));
        const TuneResult r = tune(o);
        ASSERT_GE(r.candidates.size(), plan.routes.size()) << strategy;
        for (size_t i = 0; i < plan.routes.size(); ++i) EXPECT_EQ(plan.routes[i].hash(), r.candidates[i].route_hash) << strategy << " route " << i;
        if (!plan.adaptive) EXPECT_EQ(plan.routes.size(), r.candidates.size());
        EXPECT_EQ(plan.adaptive, std::string(strategy) == "mixed");
    }
}

}  // namespace
