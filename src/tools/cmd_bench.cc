// `kiln bench MODEL|ENGINE`: trtexec-style latency and throughput measurement.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "engine/coverage.h"
#include "runtime/context.h"
#include "tools/commands.h"
#include "tools/engine_source.h"
#include "tools/model_io.h"

namespace kiln::tools {

namespace {

struct BenchOptions {
    std::string model;
    InputOptions inputs;
    BuildOptions build;
    int warmup = -1;          // iterations; -1: use warmup_ms
    double warmup_ms = 200;
    int iterations = 10;      // at least this many timed runs
    double duration = 1.0;    // and at least this many seconds
    bool json = false;
};

double percentile(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

void execute(BenchOptions& o) {
    check(o.iterations > 0 && o.duration >= 0 && o.warmup_ms >= 0, "--iterations must be positive, --duration and --warmup-ms non-negative");
    using Clock = std::chrono::steady_clock;
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    TensorMap inputs;
    Engine engine = engineWithInputs(o.model, o.build, o.inputs, &inputs);
    ExecutionContext ctx(engine);
    const auto warm_start = Clock::now();
    int warm = 0;
    while (o.warmup >= 0 ? warm < o.warmup : (warm == 0 || seconds(Clock::now() - warm_start) * 1000 < o.warmup_ms)) {
        ctx.run(inputs);
        ++warm;
    }
    std::vector<double> ms, gpu_ms, h2d_ms, d2h_ms;  // device-event phases of CUDA engines
    const bool live = isatty(STDERR_FILENO) && !o.json;
    const auto start = Clock::now();
    auto last_print = start;
    while (static_cast<int>(ms.size()) < o.iterations || seconds(Clock::now() - start) < o.duration) {
        const auto t0 = Clock::now();
        ctx.run(inputs);
        ms.push_back(seconds(Clock::now() - t0) * 1000);
        if (ctx.stats().gpu) {
            gpu_ms.push_back(ctx.stats().gpu_compute_ms);
            h2d_ms.push_back(ctx.stats().h2d_ms);
            d2h_ms.push_back(ctx.stats().d2h_ms);
        }
        if (live && seconds(Clock::now() - last_print) > 0.5) {
            std::fprintf(stderr, "\r  %zu runs, %.1f s, median %.3f ms ", ms.size(), seconds(Clock::now() - start), percentile(ms, 50));
            last_print = Clock::now();
        }
    }
    if (live && seconds(last_print - start) > 0) std::fprintf(stderr, "\r%60s\r", "");
    const double total = seconds(Clock::now() - start);
    double sum = 0;
    for (double v : ms) sum += v;
    BuildRoute route = BuildRoute::parse(engine.route, Builder::space());
    nlohmann::json j = {
        {"model", o.model}, {"kiln_version", KILN_VERSION}, {"target", engine.target}, {"route", engine.route}, {"route_hash", route.hash()},
        {"route_changes", route.changesText(Builder::space())}, {"warmup_runs", warm}, {"runs", ms.size()}, {"duration_s", total},
        {"throughput_per_s", static_cast<double>(ms.size()) / total},
        {"latency_ms", {{"min", *std::min_element(ms.begin(), ms.end())}, {"mean", sum / static_cast<double>(ms.size())}, {"median", percentile(ms, 50)},
                        {"p90", percentile(ms, 90)}, {"p95", percentile(ms, 95)}, {"p99", percentile(ms, 99)}, {"max", *std::max_element(ms.begin(), ms.end())}}},
        {"activation_bytes", ctx.stats().arena_bytes}, {"activation_bytes_without_reuse", ctx.stats().unplanned_bytes}, {"memory_planner", ctx.stats().planner}};
    const ContextStats& st = ctx.stats();
    const auto slow = referenceKernelNodes(engine);
    j["coverage"] = {{"nodes", engine.graph.nodes.size()}, {"reference_kernel_nodes", nlohmann::json::array()}};
    for (const auto& s : slow) j["coverage"]["reference_kernel_nodes"].push_back({{"name", s.node}, {"op", s.op}, {"why", s.why}});
    if (st.gpu) {
        j["coverage"]["host_fallback_nodes"] = nlohmann::json::array();
        for (const auto& c : st.cpu_nodes) j["coverage"]["host_fallback_nodes"].push_back(c);
    }
    if (st.gpu) {
        j["gpu"] = {{"compute_ms", {{"min", *std::min_element(gpu_ms.begin(), gpu_ms.end())}, {"median", percentile(gpu_ms, 50)}, {"p90", percentile(gpu_ms, 90)},
                                    {"p99", percentile(gpu_ms, 99)}}},
                    {"h2d_ms_median", percentile(h2d_ms, 50)}, {"d2h_ms_median", percentile(d2h_ms, 50)}, {"cuda_graph_replayed", st.graph_replayed},
                    {"weight_bytes", st.weight_bytes}, {"scratch_bytes", st.scratch_bytes}, {"cpu_nodes", st.cpu_nodes}};
    }
    if (o.json) {
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    const auto& l = j["latency_ms"];
    std::printf("runs %zu in %.2f s, throughput %.2f inferences/s\n", ms.size(), total, j["throughput_per_s"].get<double>());
    std::printf("latency ms: min %.3f  mean %.3f  median %.3f  p90 %.3f  p95 %.3f  p99 %.3f  max %.3f\n", l["min"].get<double>(), l["mean"].get<double>(),
                l["median"].get<double>(), l["p90"].get<double>(), l["p95"].get<double>(), l["p99"].get<double>(), l["max"].get<double>());
    std::printf("activation memory %zu bytes (%zu without reuse, planner %s)\n", ctx.stats().arena_bytes, ctx.stats().unplanned_bytes, ctx.stats().planner.c_str());
    if (st.gpu) {
        std::printf("gpu compute ms (device events): median %.3f  min %.3f  p99 %.3f; copies in %.3f / out %.3f ms; cuda graph %s\n",
                    percentile(gpu_ms, 50), *std::min_element(gpu_ms.begin(), gpu_ms.end()), percentile(gpu_ms, 99), percentile(h2d_ms, 50),
                    percentile(d2h_ms, 50), st.graph_replayed ? "replayed" : "not used");
        if (!st.cpu_nodes.empty()) std::printf("%zu nodes ran on the CPU, e.g. %s\n", st.cpu_nodes.size(), st.cpu_nodes.front().c_str());
    }
    std::printf("target %s, route %s\n", engine.target.c_str(), route.changesText(Builder::space()).c_str());
    if (!slow.empty()) std::printf("%s\n", coverageSummary(engine, slow).c_str());
}

}  // namespace

void addBenchCommand(CLI::App& app) {
    auto o = std::make_shared<BenchOptions>();
    CLI::App* cmd = app.add_subcommand("bench", "Measure latency and throughput of a model or engine (trtexec style)");
    cmd->add_option("model", o->model, "Model file (.onnx) or engine file")->required();
    addInputOptions(*cmd, o->inputs);
    addBuildOptions(*cmd, o->build);
    cmd->add_option("--warmup", o->warmup, "Warm-up runs (default: --warmup-ms of warm-up)");
    cmd->add_option("--warmup-ms", o->warmup_ms, "Warm-up time in milliseconds");
    cmd->add_option("--iterations", o->iterations, "Minimum number of timed runs");
    cmd->add_option("--duration", o->duration, "Minimum timed seconds");
    cmd->add_flag("--json", o->json, "Print all results as JSON");
    cmd->callback([o] { execute(*o); });
}

}  // namespace kiln::tools
