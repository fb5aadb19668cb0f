// `kiln calibrate MODEL --data DIR -o calib.json`: measures the ranges of a float model's
// quantization points over sample inputs, for `kiln build --int8 --calib calib.json`.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "onnx_import/importer.h"
#include "quant/calibration.h"
#include "tools/commands.h"
#include "tools/engine_source.h"

namespace kiln::tools {

namespace fs = std::filesystem;

namespace {

struct CalibrateCommand {
    std::string model, data, method = "minmax", output;
    int max_samples = 0;
    bool json = false;
};

// The samples: each subfolder of `dir` (sorted) that holds input_0.pb / .npy, or `dir`
// itself when it holds one set.
std::vector<TensorMap> loadSamples(const Graph& g, const std::string& dir, int max_samples) {
    check(fs::is_directory(dir), "--data: " + dir + " is not a directory");
    std::vector<fs::path> sets;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_directory() && (fs::exists(e.path() / "input_0.pb") || fs::exists(e.path() / "input_0.npy"))) sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty() && (fs::exists(fs::path(dir) / "input_0.pb") || fs::exists(fs::path(dir) / "input_0.npy"))) sets.push_back(dir);
    check(!sets.empty(), "--data: " + dir + " has no sample folders (each with input_0.pb or input_0.npy, ... in graph-input order)");
    if (max_samples > 0 && sets.size() > static_cast<size_t>(max_samples)) sets.resize(static_cast<size_t>(max_samples));
    std::vector<TensorMap> samples;
    for (const auto& s : sets) {
        InputOptions in;
        in.inputs_dir = s.string();
        samples.push_back(loadInputs(g, in));
    }
    return samples;
}

void printProgress(size_t done, size_t total, std::chrono::steady_clock::time_point start) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double eta = done ? elapsed / static_cast<double>(done) * static_cast<double>(total - std::min(done, total)) : 0;
    const int width = 30, filled = static_cast<int>(width * std::min(done, total) / std::max<size_t>(total, 1));
    std::fprintf(stderr, "\r[%s%s] %zu/%zu runs  ETA %ds ", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done, total,
                 static_cast<int>(eta));
}

}  // namespace

void addCalibrateCommand(CLI::App& app) {
    auto o = std::make_shared<CalibrateCommand>();
    CLI::App* cmd = app.add_subcommand("calibrate", "Measure activation ranges of a float model over sample inputs, for `kiln build --int8 --calib`");
    cmd->add_option("model", o->model, "Model file (.onnx)")->required();
    cmd->add_option("--data", o->data, "Folder of sample inputs: one subfolder per sample with input_0.pb (or .npy), ... in graph-input order")->required();
    cmd->add_option("--method", o->method, "minmax, entropy, or percentile:P (e.g. percentile:99.99)")->capture_default_str();
    cmd->add_option("--max-samples", o->max_samples, "Use at most this many samples (0: all)")->capture_default_str();
    cmd->add_option("-o,--output", o->output, "Calibration file to write (JSON)")->required();
    cmd->add_flag("--json", o->json, "Print a JSON summary");
    cmd->callback([o] {
        const Graph g = importOnnxModel(o->model);
        const std::vector<TensorMap> samples = loadSamples(g, o->data, o->max_samples);
        const auto start = std::chrono::steady_clock::now();
        const bool bar = isatty(STDERR_FILENO) && !o->json;
        CalibrationTable t = calibrate(g, modelFileHash(o->model), samples, o->method, [&](size_t d, size_t n) {
            if (bar) printProgress(d, n, start);
        });
        if (bar) std::fprintf(stderr, "\n");
        writeCalibration(t, o->output);
        if (o->json)
            std::cout << nlohmann::json{{"output", o->output}, {"method", t.method}, {"samples", t.samples}, {"tensors", t.ranges.size()}}.dump() << "\n";
    });
}

}  // namespace kiln::tools
