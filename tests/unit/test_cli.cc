// End-to-end tests of the `kiln` binary: exit codes, one-line errors, output files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "onnx_import/tensor_proto.h"
#include "runtime/accuracy.h"
#include "test_helpers.h"

using namespace kiln;
using namespace kiln::testing;

namespace {
const std::string kKiln = KILN_BIN;
const std::string kModels = std::string(KILN_SOURCE_DIR) + "/models";

struct Result {
    int rc;
    std::string out;
};
Result kilnCli(const std::string& args) {
    Result r;
    r.rc = runCommand(kKiln + " " + args, &r.out);
    return r;
}
void expectOneLineError(const Result& r, const std::string& fragment) {
    EXPECT_GT(r.rc, 0);
    EXPECT_LT(r.rc, 124);
    EXPECT_EQ(r.out.rfind("kiln: error: ", 0), 0u) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(fragment), std::string::npos) << r.out;
}
}  // namespace

TEST(Cli, HelpAndVersion) {
    EXPECT_EQ(kilnCli("--help").rc, 0);
    EXPECT_EQ(kilnCli("run --help").rc, 0);
    Result v = kilnCli("--version");
    EXPECT_EQ(v.rc, 0);
    EXPECT_NE(v.out.find("kiln "), std::string::npos);
}

TEST(Cli, RunWritesOutputsThatMatchTheReference) {
    TempDir dir;
    const std::string m = kModels + "/small_cnn";
    Result r = kilnCli("run " + m + "/model.onnx --inputs-dir " + m + "/test_data_set_0 --outputs-dir " + dir.path().string());
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("logits: f32[2,10]"), std::string::npos) << r.out;
    std::string name;
    Tensor got = loadTensorFile(dir / "output_0.pb", &name);
    EXPECT_EQ(name, "logits");
    ErrorStats e = compareOutputs(got, loadTensorFile(m + "/test_data_set_0/output_0.pb"), "logits");
    EXPECT_LT(e.rel_l2, 1e-5);
}

TEST(Cli, RandomInputsNeedShapesForSymbolicDims) {
    const std::string model = kModels + "/mlp/model.onnx";
    expectOneLineError(kilnCli("run " + model), "--shapes x:DIMS");
    Result r = kilnCli("run " + model + " --shapes x:3x64 --seed 7 --json");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("\"shape\""), std::string::npos);
    EXPECT_EQ(r.out, kilnCli("run " + model + " --shapes x:3x64 --seed 7 --json").out);  // seeded: repeatable
}

TEST(Cli, BadInputsGiveOneLineErrors) {
    TempDir dir;
    writeFile(dir / "corrupt.onnx", std::string(64, '\x07'));
    expectOneLineError(kilnCli("run " + (dir / "corrupt.onnx").string()), "not a valid ONNX model");
    expectOneLineError(kilnCli("run " + (dir / "absent.onnx").string()), "no such file");

    auto m = makeModel({2});
    addNode(m, "NoSuchOp", {"x"}, {"y"});
    saveModel(m, dir / "unknown.onnx");
    expectOneLineError(kilnCli("run " + (dir / "unknown.onnx").string()), "(NoSuchOp)");

    std::mt19937 rng(2);
    saveTensorFile(randomTensor({3, 65}, rng), "x", dir / "x.pb");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --input x=" + (dir / "x.pb").string()), "input 'x' has shape [3,65], the model expects [batch,64]");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --input nope=" + (dir / "x.pb").string()), "unknown input 'nope'");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --shapes x:2xbad"), "--shapes");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --shapes x:3x65"), "--shapes x: dim 1 is 65 but the model fixes it to 64");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --shapes x:3"), "--shapes x: rank 1 but the model declares [batch,64]");
    expectOneLineError(kilnCli("run --no-such-flag " + kModels + "/mlp/model.onnx"), "no-such-flag");
    expectOneLineError(kilnCli("run " + kModels + "/mlp/model.onnx --inputs-dir " + dir.path().string()), "input_0.pb is missing");
}

TEST(Cli, TuneKilledMidSearchResumesWithoutRepeatingCandidates) {
    TempDir dir;
    const std::string cache = (dir / "cache.jsonl").string();
    const std::string m = kModels + "/mlp";
    const std::string args = " tune " + m + "/model.onnx --golden " + m + "/test_data_set_0 --expr 'opt.dce=[on,off] debug.fault=[none,hang,wrong]'" +
                             " --strategy exhaustive --iterations 2 --warmup 1 --tuning-cache " + cache;
    // Start in its own process group, wait until the hanging candidate is in flight, SIGKILL.
    std::string pid;
    runCommand("setsid " + kKiln + args + " --timeout-per-candidate 60 >/dev/null 2>&1 & echo $!", &pid);
    pid.erase(pid.find_last_not_of(" \n") + 1);
    auto lines = [&] {
        const std::string text = readFile(cache);
        return std::count(text.begin(), text.end(), '\n');
    };
    // The default is measured first; then (dce=on, hang) hangs: kill while it is in flight.
    for (int i = 0; i < 200 && lines() < 1; ++i) usleep(50000);
    usleep(300000);
    std::string kill_out;
    EXPECT_EQ(runCommand("kill -9 -" + pid, &kill_out), 0) << "pid [" << pid << "] " << kill_out;
    const auto measured_before = lines();
    EXPECT_GE(measured_before, 1);
    // 4 s: long enough for a real candidate on a loaded machine, short for the two that hang.
    Result resumed = kilnCli(args + " --continue --timeout-per-candidate 4 --json");
    ASSERT_EQ(resumed.rc, 0) << resumed.out;
    EXPECT_NE(resumed.out.find("\"from_cache\": " + std::to_string(measured_before)), std::string::npos) << resumed.out;
    EXPECT_NE(resumed.out.find("\"timeout\": 2"), std::string::npos) << resumed.out;  // both hang routes
    EXPECT_EQ(runCommand("pgrep -f '[d]ebug.fault=.none,hang' >/dev/null", nullptr), 1);       // no orphaned candidate left
    // Each search candidate appears once in the cache.
    std::set<std::string> hashes;
    std::stringstream cached(readFile(cache));
    for (std::string l; std::getline(cached, l);) {
        if (l.find("remeasure") != std::string::npos) continue;
        const auto at = l.find("\"route_hash\":\"");
        EXPECT_TRUE(hashes.insert(l.substr(at, 34)).second) << "measured twice: " << l;
    }
    EXPECT_EQ(hashes.size(), 6u);
}

TEST(Cli, TuneOverAShapeProfileWritesAnEngineForTheWholeRange) {
    TempDir dir;
    const std::string engine = (dir / "best.kiln").string(), m = kModels + "/mlp/model.onnx";
    Result r = kilnCli("tune " + m + " --expr 'fusion.gemm_bias_act=[on,off]' --minShapes x:1x64 --optShapes x:4x64 --maxShapes x:32x64 --objective geomean" +
                       " --iterations 2 --warmup 1 --rounds 1 --json -o " + engine + " 2>/dev/null");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("\"objective\": \"geomean\""), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("max (x:[32,64])"), std::string::npos) << r.out;
    // The engine runs at both ends of the range, and refuses a batch outside it.
    EXPECT_EQ(kilnCli("bench " + engine + " --shapes x:32x64 --iterations 2 >/dev/null").rc, 0);
    EXPECT_EQ(kilnCli("bench " + engine + " --shapes x:1x64 --iterations 2 >/dev/null").rc, 0);
    EXPECT_NE(kilnCli("bench " + engine + " --shapes x:33x64 --iterations 2").rc, 0);
    expectOneLineError(kilnCli("tune " + m + " --objective geomean --expr default"), "--minShapes");
}

TEST(Cli, CalibrateThenBuildInt8) {
    TempDir dir;
    const std::string m = kModels + "/small_cnn", calib = (dir / "calib.json").string(), engine = (dir / "q.kiln").string();
    Result c = kilnCli("calibrate " + m + "/model.onnx --data " + m + "/test_data_set_0 -o " + calib);
    ASSERT_EQ(c.rc, 0) << c.out;
    EXPECT_EQ(c.out, "");  // quiet on success
    Result b = kilnCli("build " + m + "/model.onnx --int8 --calib " + calib + " -o " + engine);
    ASSERT_EQ(b.rc, 0) << b.out;
    EXPECT_NE(kilnCli("inspect " + engine).out.find("QLinearConv"), std::string::npos);
    // Calibrated on the very input it runs: int8 error only.
    Result r = kilnCli("run " + engine + " --inputs-dir " + m + "/test_data_set_0 --expected-dir " + m + "/test_data_set_0 --max-rel-l2 0.05");
    EXPECT_EQ(r.rc, 0) << r.out;
    expectOneLineError(kilnCli("build " + m + "/model.onnx --int8 -o " + engine), "--int8 needs --calib");
    expectOneLineError(kilnCli("build " + kModels + "/mlp/model.onnx --int8 --calib " + calib + " -o " + engine), "measured on another model");
    expectOneLineError(kilnCli("calibrate " + m + "/model.onnx --data " + m + "/test_data_set_0 --method median -o " + calib), "--method median");
    expectOneLineError(kilnCli("calibrate " + m + "/model.onnx --data " + dir.path().string() + " -o " + calib), "has no sample folders");
    expectOneLineError(kilnCli("build " + m + "/model.onnx --calib " + calib + " -o " + engine), "--calib applies only");
    expectOneLineError(kilnCli("build " + m + "/model.onnx --route precision.conv=int8 -o " + engine), "needs calibration ranges");
}

TEST(Cli, TuneWeighsInt8AgainstF32UnderTheTolerance) {
    TempDir dir;
    const std::string m = kModels + "/small_cnn", calib = (dir / "calib.json").string(), report = (dir / "r.json").string();
    ASSERT_EQ(kilnCli("calibrate " + m + "/model.onnx --data " + m + "/test_data_set_0 -o " + calib).rc, 0);
    const std::string tune = "tune " + m + "/model.onnx --golden " + m + "/test_data_set_0 --calib " + calib +
                             " --expr 'precision.conv=[f32,int8] quant.skip_first_last=[off,on]' --iterations 3 --warmup 1 --rounds 1 --json --report " + report;
    // Loose: every candidate passes, and each int8 one reports the error it has.
    Result loose = kilnCli(tune + " --tolerance rel-l2=0.5 2>/dev/null");
    ASSERT_EQ(loose.rc, 0) << loose.out;
    EXPECT_NE(loose.out.find("\"ok\": 4"), std::string::npos) << loose.out;
    const std::string text = readFile(report);
    EXPECT_NE(text.find("--calib " + calib), std::string::npos);  // in the rebuild command
    const auto j = nlohmann::json::parse(text);
    for (const auto& c : j.at("candidates")) {
        const bool int8 = c.at("changes").get<std::string>().find("precision.conv=int8") != std::string::npos;
        if (int8) EXPECT_GT(c.at("error").get<double>(), 1e-6) << c.dump();
        else EXPECT_LT(c.at("error").get<double>(), 1e-5) << c.dump();
    }
    // Tight: the int8 routes fail the gate and the float default stays.
    Result tight = kilnCli(tune + " --tolerance rel-l2=1e-5 2>/dev/null");
    ASSERT_EQ(tight.rc, 0) << tight.out;
    EXPECT_NE(tight.out.find("\"accuracy_fail\": 2"), std::string::npos) << tight.out;
    // (quant.skip_first_last alone builds the same f32 engine, so noise may pick it.)
    EXPECT_EQ(tight.out.find("\"best_changes\": \"precision.conv=int8"), std::string::npos) << tight.out;
    EXPECT_NE(tight.out.find("\"best_changes\""), std::string::npos) << tight.out;
}
