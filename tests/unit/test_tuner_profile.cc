// Tuning over a shape profile: candidates built for --minShapes..--maxShapes, checked at
// min, opt and max, and timed by the objective (opt, or the geomean over the points).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_helpers.h"
#include "tuner/tuner.h"
#include "tuner_test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {

// These run `kiln tune` in a fresh process: the candidates time batches large enough for
// OpenMP regions, and libgomp cannot run one in a child forked from a process (this test
// binary) whose own OpenMP pool already exists. The tuner's parent never starts one.
nlohmann::json tuneJson(const std::string& args, const std::string& report) {
    std::string out;
    const int rc = runCommand(std::string(KILN_BIN) + " tune " + KILN_SOURCE_DIR + "/models/mlp/model.onnx --iterations 3 --warmup 1 --rounds 1 --report " + report +
                                  " " + args + " --json 2>/dev/null",
                              &out);
    EXPECT_EQ(rc, 0) << out;
    return nlohmann::json::parse(readFile(report));
}

}  // namespace

TEST(TunerProfile, CandidatesAreCheckedAtTheProfilesMaxShapes) {
    // The fault is wrong only past 16 rows: at opt (4) it passes, at max (32) it must not.
    TempDir dir;
    const std::string faults = "--expr 'debug.fault=[none,wrong_past_16_rows]' ";
    auto outcomeOf = [](const nlohmann::json& report, const std::string& fault) {
        for (const auto& c : report.at("candidates"))
            if ((c.at("changes").get<std::string>().find("wrong_past_16_rows") != std::string::npos) == (fault != "none"))
                return c.at("outcome").get<std::string>() + ": " + c.at("message").get<std::string>();
        return std::string("missing");
    };
    const auto r = tuneJson(faults + "--minShapes x:1x64 --optShapes x:4x64 --maxShapes x:32x64", (dir / "p.json").string());
    EXPECT_EQ(outcomeOf(r, "none").substr(0, 2), "ok");
    const std::string wrong = outcomeOf(r, "wrong_past_16_rows");
    EXPECT_EQ(wrong.rfind("accuracy_fail", 0), 0u) << wrong;
    EXPECT_NE(wrong.find("at the max shapes"), std::string::npos) << wrong;
    EXPECT_NE(r.at("golden").get<std::string>().find("max (x:[32,64])"), std::string::npos) << r.at("golden");
    // Without the profile, at 4 rows only, the same fault goes unseen.
    EXPECT_EQ(outcomeOf(tuneJson(faults + "--shapes x:4x64", (dir / "f.json").string()), "wrong_past_16_rows").substr(0, 2), "ok");
}

TEST(TunerProfile, GeomeanObjectiveTimesEveryPoint) {
    // One row against 2048: the geomean of both is far above the one-row time alone.
    TempDir dir;
    const std::string profile = "--expr default --minShapes x:1x64 --maxShapes x:2048x64 --objective ";
    const auto at_opt = tuneJson(profile + "opt", (dir / "opt.json").string()), over_all = tuneJson(profile + "geomean", (dir / "geo.json").string());
    ASSERT_EQ(at_opt.at("candidates").size(), 1u);
    ASSERT_EQ(over_all.at("candidates").size(), 1u);
    EXPECT_NE(over_all.at("golden").get<std::string>().find("geomean"), std::string::npos);
    EXPECT_EQ(over_all.at("objective"), "geomean");
    EXPECT_GT(over_all.at("candidates")[0].at("median_ms").get<double>(), 3 * at_opt.at("candidates")[0].at("median_ms").get<double>());
}

TEST(TunerProfile, CachedResultsOfAnotherObjectiveOrShapeAreNotReused) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string(), report = (dir / "r.json").string();
    const std::string search = "--expr 'fusion.gemm_bias_act=[on,off]' --minShapes x:1x64 --optShapes x:4x64 --tuning-cache " + cache;
    tuneJson(search + " --maxShapes x:32x64 --objective geomean", report);
    EXPECT_EQ(tuneJson(search + " --maxShapes x:32x64 --objective geomean --continue", report).at("from_cache"), 2);  // the same setup
    const auto other = tuneJson(search + " --maxShapes x:32x64 --objective opt --continue", report);
    EXPECT_EQ(other.at("from_cache"), 0);
    bool warned = false;
    for (const auto& w : other.at("warnings")) warned |= w.get<std::string>().find("measurement setup") != std::string::npos;
    EXPECT_TRUE(warned) << other.at("warnings").dump();
    EXPECT_EQ(tuneJson(search + " --maxShapes x:64x64 --objective geomean --continue", report).at("from_cache"), 0);
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
