// ONNX backend-test conformance runner. For every test folder (model.onnx plus
// test_data_set_*/input_*.pb and output_*.pb) it imports the model, runs each data set and
// compares with the expected outputs at the ONNX backend tests' tolerances (rtol 1e-3,
// atol 1e-7). A test is
//   PASS         every data set matches,
//   FAIL         an output differs, or running raised an error,
//   UNSUPPORTED  the importer rejects an op or type Kiln does not implement,
//   EXCLUDED     training, sequence, optional, map or string tests (out of scope).
// The pass rate counts PASS over all tests that are not EXCLUDED.
#include <onnx/onnx_pb.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "backends/backend.h"
#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "engine/builder.h"
#include "runtime/context.h"
#include "backends/cpu/graph_executor.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

enum class Outcome { Pass, Fail, Unsupported, Excluded };
const char* outcomeName(Outcome o) {
    static const char* names[] = {"PASS", "FAIL", "UNSUPPORTED", "EXCLUDED"};
    return names[static_cast<int>(o)];
}

bool outOfScopeType(const onnx::TypeProto& t) {
    if (t.has_sequence_type() || t.has_optional_type() || t.has_map_type()) return true;
    return t.has_tensor_type() && t.tensor_type().elem_type() == onnx::TensorProto::STRING;
}

// Why a test is out of scope, or "" when it is in scope.
std::string exclusionReason(const fs::path& dir) {
    const std::string name = dir.filename().string();
    for (const char* word : {"training", "sequence", "optional", "string"})
        if (name.find(word) != std::string::npos) return std::string("name mentions ") + word;
    std::ifstream in(dir / "model.onnx", std::ios::binary);
    onnx::ModelProto m;
    if (!m.ParseFromIstream(&in)) return "";
    for (const auto& v : m.graph().input())
        if (outOfScopeType(v.type())) return "sequence/optional/map/string input";
    for (const auto& v : m.graph().output())
        if (outOfScopeType(v.type())) return "sequence/optional/map/string output";
    for (const auto& n : m.graph().node())
        if (n.domain() == "ai.onnx.preview.training") return "training op " + n.op_type();
    for (const auto& imp : m.opset_import())
        if (imp.domain() == "ai.onnx.preview.training") return "training domain";
    return "";
}

// The ONNX test data store bfloat16 tensors as their uint16 bit patterns (numpy has no
// bfloat16): read those bits as the bf16 values the model declares.
Tensor asDeclaredBfloat16(const Tensor& t, DType declared) {
    if (t.dtype() != DType::U16 || declared != DType::BF16) return t;
    Tensor bf(DType::BF16, t.dims());
    std::memcpy(bf.raw(), t.raw(), static_cast<size_t>(t.numel()) * 2);
    return bf;
}

// Empty when `got` matches `want`, else a description of the first mismatch.
std::string compareTensors(const Tensor& got, const Tensor& want, double rtol, double atol) {
    if (got.dtype() != want.dtype()) return "dtype " + got.summary() + " vs expected " + want.summary();
    if (got.dims() != want.dims()) return "shape " + got.summary() + " vs expected " + want.summary();
    for (int64_t i = 0; i < got.numel(); ++i) {
        double g = got.scalarAt(i), w = want.scalarAt(i);
        if (std::isnan(w) && std::isnan(g)) continue;
        if (std::isinf(w) && g == w) continue;
        if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w)))
            return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", expected " + std::to_string(w);
    }
    return "";
}

struct Result {
    Outcome outcome;
    std::string detail;
};

// `route` empty: the reference executor on the imported graph; otherwise an engine built
// with that route (passes + backend tactics) run in an execution context.
Result runTest(const fs::path& dir, double rtol, double atol, const std::string& route, const std::string& target) {
    if (std::string why = exclusionReason(dir); !why.empty()) return {Outcome::Excluded, why};
    Graph g;
    try {
        g = importOnnxModel(dir / "model.onnx");
    } catch (const Error& e) {
        std::string msg = e.what();
        bool unsupported = msg.find("unsupported") != std::string::npos || msg.find("not supported") != std::string::npos;
        return {unsupported ? Outcome::Unsupported : Outcome::Fail, msg};
    }
    try {
        std::unique_ptr<Engine> engine;
        std::unique_ptr<ExecutionContext> context;
        if (!route.empty()) {
            Builder b(g, "", target);
            b.setBuildRoute(BuildRoute::parse(route == "default" ? "" : route, Builder::space()));
            engine = std::make_unique<Engine>(b.build());
            context = std::make_unique<ExecutionContext>(*engine);
        }
        GraphExecutor exec(g);
        auto execute = [&](const TensorMap& in) { return context ? context->run(in) : exec.run(in); };
        std::vector<fs::path> sets;
        for (const auto& e : fs::directory_iterator(dir))
            if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
        std::sort(sets.begin(), sets.end());
        if (sets.empty()) return {Outcome::Fail, "no test_data_set folders"};
        const auto inputs_decl = g.runtimeInputs();
        for (const auto& set : sets) {
            TensorMap inputs;
            for (size_t i = 0;; ++i) {
                fs::path p = set / ("input_" + std::to_string(i) + ".pb");
                if (!fs::exists(p)) break;
                std::string name;
                Tensor t = loadTensorFile(p, &name);
                if (name.empty() && i < inputs_decl.size()) name = inputs_decl[i].name;
                const ValueInfo* declared = g.findValueInfo(name);
                inputs[name] = declared ? asDeclaredBfloat16(t, declared->dtype) : t;
            }
            auto outputs = execute(inputs);
            for (size_t i = 0; i < outputs.size(); ++i) {
                fs::path p = set / ("output_" + std::to_string(i) + ".pb");
                if (!fs::exists(p)) return {Outcome::Fail, "missing " + p.string()};
                std::string diff = compareTensors(outputs[i], asDeclaredBfloat16(loadTensorFile(p), outputs[i].dtype()), rtol, atol);
                if (!diff.empty()) return {Outcome::Fail, set.filename().string() + " output " + g.outputs[i].name + ": " + diff};
            }
        }
    } catch (const std::exception& e) {
        return {Outcome::Fail, e.what()};
    }
    return {Outcome::Pass, ""};
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Run the ONNX backend test suite against Kiln's CPU reference runtime", "kiln_conformance"};
    std::string data_dir = "/usr/share/libonnx-testdata/data";
    std::vector<std::string> suites = {"node", "simple", "pytorch-converted", "pytorch-operator"};
    std::string filter, summary_file;
    std::vector<std::string> required;
    double rtol = 1e-3, atol = 1e-7, min_rate = 0.0;
    bool verbose = false;
    std::string route;
    app.add_option("--data-dir", data_dir, "Root of the ONNX backend test data");
    app.add_option("--suite", suites, "Suites (sub-folders) to run");
    app.add_option("--filter", filter, "Only tests whose name contains this text");
    app.add_option("--rtol", rtol, "Relative tolerance");
    app.add_option("--atol", atol, "Absolute tolerance");
    app.add_option("--min-pass-rate", min_rate, "Exit non-zero if the node suite's pass rate is below this (0-1)");
    app.add_option("--require", required, "Test names that must pass (exit non-zero otherwise)");
    app.add_option("--summary-file", summary_file, "Also write the summary lines here");
    app.add_flag("-v,--verbose", verbose, "Print every test, not only failures");
    app.add_option("--route", route, "Build each model into an engine with this route ('default' for the default route) instead of running the reference executor");
    std::string target = "cpu";
    app.add_option("--target", target, "Build engines for this target (" + backendNamesText() + "); other than cpu, implies --route default")
        ->check(CLI::IsMember(backendNames()));
    CLI11_PARSE(app, argc, argv);
    if (target != "cpu") {
        try {
            backendFor(target).signature();  // throws where the target cannot run (no GPU)
        } catch (const Error& e) {
            std::cout << "conformance on " << target << " skipped: " << e.what() << "\n";
            return 77;  // CTest's skip code (SKIP_RETURN_CODE)
        }
        if (route.empty()) route = "default";
    }

    if (!fs::is_directory(data_dir)) {
        std::cerr << "kiln_conformance: error: " << data_dir << " not found (install the Debian package libonnx-testdata)\n";
        return 2;
    }
    std::set<std::string> must_pass(required.begin(), required.end());
    std::vector<std::string> missed;
    std::string summary;
    double node_rate = 0;
    for (const auto& suite : suites) {
        fs::path root = fs::path(data_dir) / suite;
        if (!fs::is_directory(root)) continue;
        std::vector<fs::path> tests;
        for (const auto& e : fs::directory_iterator(root))
            if (e.is_directory() && fs::exists(e.path() / "model.onnx") && e.path().filename().string().find(filter) != std::string::npos) tests.push_back(e.path());
        std::sort(tests.begin(), tests.end());
        int counts[4] = {0, 0, 0, 0};
        for (const auto& t : tests) {
            Result r = runTest(t, rtol, atol, route, target);
            ++counts[static_cast<int>(r.outcome)];
            const std::string name = t.filename().string();
            if (must_pass.count(name) && r.outcome != Outcome::Pass) missed.push_back(name);
            if (verbose || r.outcome == Outcome::Fail)
                std::cout << outcomeName(r.outcome) << " " << suite << "/" << name << (r.detail.empty() ? "" : "  -- " + r.detail) << "\n";
        }
        const int eligible = counts[0] + counts[1] + counts[2];
        const double rate = eligible ? static_cast<double>(counts[0]) / eligible : 0.0;
        if (suite == "node") node_rate = rate;
        char line[256];
        std::snprintf(line, sizeof line, "conformance %-18s pass %4d  fail %4d  unsupported %4d  excluded %4d  pass rate %.1f%% of %d\n",
                      suite.c_str(), counts[0], counts[1], counts[2], counts[3], 100.0 * rate, eligible);
        summary += line;
    }
    std::cout << summary;
    if (!summary_file.empty()) std::ofstream(summary_file) << summary;
    int rc = 0;
    if (!missed.empty()) {
        std::cout << "required tests not passing:";
        for (const auto& m : missed) std::cout << " " << m;
        std::cout << "\n";
        rc = 1;
    }
    if (node_rate < min_rate) {
        std::cout << "node pass rate " << 100.0 * node_rate << "% is below the required " << 100.0 * min_rate << "%\n";
        rc = 1;
    }
    return rc;
}
