// Tuning over a shape profile: candidates built for --minShapes..--maxShapes, checked at
// min, opt and max, and timed by the objective (opt, or the geomean over the points).
#include <gtest/gtest.h>

#include <fstream>

#include "test_helpers.h"
#include "tuner/tuner.h"
#include "tuner_test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// The bundled MLP (input x: batch x 64) with random golden data over a batch range.
TunerOptions profiled(const std::string& expr, int64_t min_rows, int64_t opt_rows, int64_t max_rows, const std::string& cache = "") {
    TunerOptions o = options(expr, cache);
    o.golden_dir.clear();
    o.policy.profile["x"] = ShapeRange{{min_rows, 64}, {opt_rows, 64}, {max_rows, 64}};
    return o;
}

std::string outcomeOf(const TuneResult& r, const std::string& fault) {
    for (const auto& c : r.candidates)
        if (BuildRoute::parse(c.route, Builder::space()).get("debug.fault") == fault) return outcomeName(c.outcome) + ": " + c.message;
    return "missing";
}

}  // namespace

TEST(TunerProfile, CandidatesAreCheckedAtTheProfilesMaxShapes) {
    // The fault is wrong only past 16 rows: at opt (4) it passes, at max (32) it must not.
    TuneResult r = tune(profiled("debug.fault=[none,wrong_past_16_rows]", 1, 4, 32));
    EXPECT_EQ(outcomeOf(r, "none").substr(0, 2), "ok");
    const std::string wrong = outcomeOf(r, "wrong_past_16_rows");
    EXPECT_EQ(wrong.rfind("accuracy_fail", 0), 0u) << wrong;
    EXPECT_NE(wrong.find("at the max shapes"), std::string::npos) << wrong;
    EXPECT_NE(r.golden_source.find("max (x:[32,64])"), std::string::npos) << r.golden_source;
    // Without the profile, at 4 rows only, the same fault goes unseen.
    TunerOptions fixed = options("debug.fault=[none,wrong_past_16_rows]", "");
    fixed.golden_dir.clear();
    fixed.input_shapes["x"] = {4, 64};
    EXPECT_EQ(outcomeOf(tune(fixed), "wrong_past_16_rows").substr(0, 2), "ok");
}

TEST(TunerProfile, GeomeanObjectiveTimesEveryPoint) {
    // One row against 2048: the geomean of both is far above the one-row time alone.
    TunerOptions opt = profiled("default", 1, 1, 2048);
    TunerOptions geo = opt;
    geo.objective = "geomean";
    const TuneResult at_opt = tune(opt), over_all = tune(geo);
    ASSERT_EQ(at_opt.candidates.size(), 1u);
    ASSERT_EQ(over_all.candidates.size(), 1u);
    EXPECT_NE(over_all.golden_source.find("geomean"), std::string::npos);
    EXPECT_GT(over_all.candidates[0].median_ms, 3 * at_opt.candidates[0].median_ms);
}

TEST(TunerProfile, CachedResultsOfAnotherObjectiveOrShapeAreNotReused) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string();
    TunerOptions o = profiled("fusion.gemm_bias_act=[on,off]", 1, 4, 32, cache);
    o.objective = "geomean";
    tune(o);
    o.resume = true;
    EXPECT_EQ(tune(o).from_cache, 2u);  // the same setup: both candidates come from the cache
    TunerOptions other = o;
    other.objective = "opt";
    const TuneResult r = tune(other);
    EXPECT_EQ(r.from_cache, 0u);
    bool warned = false;
    for (const auto& w : r.warnings) warned |= w.find("measurement setup") != std::string::npos;
    EXPECT_TRUE(warned);
    other = o;
    other.policy.profile["x"].max = {64, 64};
    EXPECT_EQ(tune(other).from_cache, 0u);
}

TEST(TunerProfile, BadProfileOptionsAreClearErrors) {
    TunerOptions geo = options("default", "");
    geo.objective = "geomean";  // no profile
    EXPECT_THROW(tune(geo), Error);
    geo.objective = "fastest";
    EXPECT_THROW(tune(geo), Error);
    // A profile that excludes the golden files' shapes is refused.
    TunerOptions outside = options("default", "");
    outside.policy.profile["x"] = ShapeRange{{100, 64}, {100, 64}, {200, 64}};
    try {
        tune(outside);
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside the profile"), std::string::npos) << e.what();
    }
}
