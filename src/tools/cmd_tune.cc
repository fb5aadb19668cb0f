// `kiln tune MODEL`: accuracy-gated search over build routes (see tuner/tuner.h).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "llm/model_loader.h"
#include "onnx_import/importer.h"
#include "route/expression.h"
#include "tools/commands.h"
#include "tools/cmd_tune_llm.h"
#include "tools/engine_source.h"
#include "tools/tune_mpi.h"
#include "tuner/tuner.h"

namespace kiln::tools {

namespace {

struct TuneCommand {
    TunerOptions options;
    std::vector<std::string> tolerance;
    std::string strategy, budget;
    std::string output, report;
    std::vector<std::string> shapes;  // NAME:DIMS
    std::vector<std::string> min_shapes, opt_shapes, max_shapes;
    bool dry_run = false, json = false;
    LlmTuneCommand llm;  // a model folder: the LLM runtime's parameters
};

// A progress bar with ETA when the total is known (exhaustive), a counter otherwise.
void printProgress(size_t done, size_t total, double best_ms, std::chrono::steady_clock::time_point start) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (total == 0) {
        std::fprintf(stderr, "\r  %zu candidates, %ds, best %.3f ms ", done, static_cast<int>(elapsed), best_ms);
        return;
    }
    const double eta = done ? elapsed / static_cast<double>(done) * static_cast<double>(total > done ? total - done : 0) : 0;
    const int width = 30, filled = static_cast<int>(width * std::min(done, total) / total);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu  ETA %ds  best %.3f ms ", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done, total,
                 static_cast<int>(eta), best_ms);
}

// A model folder tunes the LLM runtime; the shared flags carry over.
void executeLlm(TuneCommand& c) {
    const TunerOptions& o = c.options;
    LlmTuneCommand& l = c.llm;
    const auto targets = llm::llmTargets();
    check(std::find(targets.begin(), targets.end(), o.policy.target) != targets.end(), "--target " + o.policy.target + ": an LLM runs on cpu or cuda");
    check(o.objective != "geomean", "--objective geomean is for shape profiles; an LLM tunes tpot, ttft or throughput");
    l.model = o.model_path;
    l.policy.target = o.policy.target;
    l.policy.expr = o.expr;
    l.policy.objective = o.objective == "opt" ? "tpot" : o.objective;
    l.policy.rounds = o.rounds;
    l.policy.min_gain = o.min_gain;
    l.policy.max_spread = o.max_spread;
    l.policy.seed = l.policy.workload.seed = o.seed;
    l.report = c.report;
    l.dry_run = c.dry_run;
    l.json = c.json;
    executeLlmTune(l);
}

void execute(TuneCommand& c) {
    TunerOptions& o = c.options;
    if (std::filesystem::is_directory(o.model_path)) return executeLlm(c);
    check(o.objective == "opt" || o.objective == "geomean", "--objective " + o.objective + " is for an LLM folder; an .onnx model tunes opt or geomean");
    o.tolerance = AccuracyCriterion::parse(c.tolerance);
    if (!c.strategy.empty()) o.strategy = parseStrategy(c.strategy);
    o.budget = Budget::parse(c.budget);
    for (const auto& spec : c.shapes) o.input_shapes.insert(parseNamedShape(spec, "--shapes"));
    o.policy.profile = profileFromFlags(c.min_shapes, c.opt_shapes, c.max_shapes);
    if (!o.calib_path.empty()) o.policy.calibration = calibrationFor(o.calib_path, o.model_path, modelFileHash(o.model_path));
    check(o.policy.iterations > 0 && o.policy.warmup >= 0 && o.policy.timeout_s > 0, "--iterations must be positive, --warmup non-negative, --timeout-per-candidate positive");
    if (c.dry_run) {
        const TunePlan plan = planTune(o, importOnnxModel(o.model_path));
        if (c.json) {
            nlohmann::json routes = nlohmann::json::array();
            for (const auto& r : plan.routes) routes.push_back({{"route_hash", r.hash()}, {"changes", r.changesText(Builder::space())}});
            std::cout << nlohmann::json{{"expression", plan.expression}, {"strategy", plan.strategy}, {"objective", o.objective}, {"adaptive", plan.adaptive}, {"rule", plan.rule},
                                        {"combinations", plan.combinations}, {"routes", routes}}
                             .dump(2)
                      << "\n";
            return;
        }
        std::cout << "strategy " << plan.strategy << " over '" << plan.expression << "'";
        if (!o.policy.profile.empty()) std::cout << ", built for the shape profile, checked at min, opt and max, timed " << (o.objective == "geomean" ? "at all three (geomean)" : "at opt");
        std::cout << "\n";
        if (plan.adaptive) std::cout << "phase 1 (" << plan.routes.size() << " routes):\n";
        for (const auto& r : plan.routes) std::cout << r.hash() << "  " << r.changesText(Builder::space()) << "\n";
        if (plan.adaptive) std::cout << plan.rule << "\n";
        std::cout << plan.routes.size() << (plan.adaptive ? " routes in phase 1" : " candidate routes") << " (dry run: nothing built); then the "
                  << o.finalists << " fastest, the default and up to " << o.effects << " single changes are re-measured in " << o.rounds << " interleaved rounds\n";
        return;
    }
    std::unique_ptr<MpiTuning> mpi;
    if (launchedUnderMpi()) {
        mpi = std::make_unique<MpiTuning>();
        if (mpi->rank() > 0) {  // a worker: serve candidates, print nothing
            mpi->serve(o);
            return;
        }
        o.remote_batch = [&](const std::vector<BuildRoute>& routes) {
            return mpi->dispatch(routes, o.policy);
        };
        if (!c.json) std::cout << "distributed over " << mpi->size() << " MPI ranks: rank 0 coordinates, " << mpi->size() - 1 << " evaluate candidates\n";
    }
    const auto start = std::chrono::steady_clock::now();
    if (isatty(STDERR_FILENO) && !c.json) o.progress = [&](size_t d, size_t t, const CandidateResult&, double best) { printProgress(d, t, best, start); };
    TuneResult r = tune(o);
    if (o.progress) std::fprintf(stderr, "\n");
    for (const auto& w : r.warnings) std::cerr << "kiln: warning: " << w << "\n";
    if (!c.report.empty()) writeTuneReport(r, o, c.report);
    const std::string best_changes = BuildRoute::parse(r.best_route, Builder::space()).changesText(Builder::space());
    if (!c.output.empty()) {
        Builder b(importOnnxModel(o.model_path), modelFileHash(o.model_path), o.policy.target);
        b.setCalibration(o.policy.calibration);
        b.setBuildRoute(BuildRoute::parse(r.best_route, Builder::space()));
        if (!o.policy.profile.empty()) b.setShapeProfile(o.policy.profile);
        writeEngine(b.build(), c.output);
    }
    std::map<std::string, int> outcomes;
    for (const auto& cand : r.candidates) ++outcomes[outcomeName(cand.outcome)];
    if (c.json) {
        nlohmann::json j{{"expression", r.expression}, {"strategy", r.strategy}, {"best_gain", r.best_gain}, {"golden", r.golden_source}, {"objective", o.objective}, {"candidates", r.candidates.size()},
                         {"from_cache", r.from_cache}, {"outcomes", outcomes}, {"best_route", r.best_route}, {"best_changes", best_changes}, {"speedup_over_default", r.speedup},
                         {"speedup_interval", {r.speedup_interval.low, r.speedup_interval.high}}, {"significant", r.significant}, {"noise", r.noise}};
        if (r.verified) j["verification"] = {{"speedup", r.verification.estimate}, {"interval", {r.verification.low, r.verification.high}}, {"win_held", r.win_held}};
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    std::cout << "searched " << r.candidates.size() << " candidates (" << r.from_cache << " from cache" << (r.budget_exhausted ? ", budget exhausted" : "")
              << ") with strategy " << r.strategy << " over '" << r.expression << "'\n";
    std::cout << "golden: " << r.golden_source << "\n";
    for (const auto& [k, v] : outcomes) std::cout << "  " << k << ": " << v << "\n";
    for (const auto& f : r.finalists)
        std::printf("  finalist %-60s median %.3f ms, %.3fx [%.3f, %.3f] (spread %.1f%%)\n", BuildRoute::parse(f.route, Builder::space()).changesText(Builder::space()).c_str(),
                    f.median_ms, f.speedup.estimate, f.speedup.low, f.speedup.high, f.spread * 100);
    if (r.significant)
        std::printf("best route: %s — %.2fx faster than the default route (95%% interval %.2f-%.2fx)\n", best_changes.c_str(), r.speedup, r.speedup_interval.low,
                    r.speedup_interval.high);
    else if (!r.noise.empty()) std::printf("the timing stayed noisy (%s); keeping the default route\n", r.noise.c_str());
    else
        std::printf("no significant gain over the default route (best finalist %+.1f%%; its interval must clear %.0f%%); keeping the default\n", r.best_gain * 100,
                    o.min_gain * 100);
    if (r.verified)
        std::printf("--verify %d: %.2fx [%.2f, %.2f] in fresh builds; the win %s\n", o.verify, r.verification.estimate, r.verification.low, r.verification.high,
                    r.win_held ? "held" : "did not hold");
}

}  // namespace

void addTuneCommand(CLI::App& app) {
    auto c = std::make_shared<TuneCommand>();
    TunerOptions& o = c->options;
    CLI::App* cmd = app.add_subcommand("tune", "Search build routes for the fastest engine that meets the accuracy criterion");
    cmd->option_defaults()->always_capture_default();
    cmd->add_option("model", o.model_path, "Model file (.onnx), or an LLM folder (tunes the llm.* runtime parameters on a serving workload)")->required();
    cmd->add_option("--expr", o.expr, "Route expression whose routes (or, for greedy/mixed, whose parameter values) are searched; default: every value of the parameters that affect the model");
    cmd->add_option("--golden", o.golden_dir, "Folder with input_N.pb / output_N.pb (default: seeded random inputs, outputs of the f32 reference)");
    cmd->add_option("--shapes", c->shapes, "Shapes of random golden inputs with symbolic dims, NAME:DIMS (repeatable; default: symbolic dims = 1)");
    cmd->add_option("--minShapes,--min-shapes", c->min_shapes, "Shape profile minimum, NAME:DIMS (repeatable): every candidate is built for the profile and checked at min, opt and max");
    cmd->add_option("--optShapes,--opt-shapes", c->opt_shapes, "Shape profile optimum, NAME:DIMS (default: the minimum)");
    cmd->add_option("--maxShapes,--max-shapes", c->max_shapes, "Shape profile maximum, NAME:DIMS");
    cmd->add_option("--objective", o.objective,
                    "With a profile: time at the opt shapes (opt), or the geometric mean of the times at min, opt and max (geomean); an LLM folder: tpot (opt means it), ttft or throughput")
        ->check(CLI::IsMember({"opt", "geomean", "tpot", "ttft", "throughput"}));
    cmd->add_option("--calib", o.calib_path, "Calibration file from `kiln calibrate`: lets routes use precision.conv/precision.matmul=int8 (e.g. --expr 'precision.conv=[f32,int8] quant.skip_first_last=*')");
    cmd->add_option("--tolerance", c->tolerance,
                    "Accuracy criterion [OUTPUT:]METRIC=VALUE, repeatable: rel-l2 (default rel-l2=1e-3), max-abs, cosine, top-k=K");
    cmd->add_option("--tuning-cache", o.cache_path, "Append-only cache of measured candidates (JSON Lines)");
    cmd->add_flag("--continue", o.resume, "Reuse the tuning cache: skip candidates it already holds");
    cmd->add_option("--strategy", c->strategy, "exhaustive | greedy | mixed (default: exhaustive up to 64 routes, else mixed); random:N and one-at-a-time go in --expr");
    cmd->add_option("--budget", c->budget, "Stop after N new candidates, or after a time: 90s, 10m, 1h");
    cmd->add_option("--target", o.policy.target, "Target: " + backendNamesText() + " (on a GPU target, candidates are timed by GPU compute)")->check(CLI::IsMember(backendNames()));
    cmd->add_option("--timeout-per-candidate", o.policy.timeout_s, "Seconds before a candidate counts as a timeout");
    cmd->add_option("--jobs", o.jobs, "Build and validate this many candidates in parallel (timing is always one at a time)");
    cmd->add_option("--warmup", o.policy.warmup, "Warm-up runs per candidate");
    cmd->add_option("--iterations", o.policy.iterations, "Timed runs per candidate");
    cmd->add_option("--min-gain", o.min_gain, "Keep the default unless the best route's speedup interval clears this gain (fraction)");
    cmd->add_option("--rounds", o.rounds, "Interleaved re-measurement rounds of the finalists")->check(CLI::PositiveNumber);
    cmd->add_option("--finalists", o.finalists, "Fastest candidates re-measured against the default");
    cmd->add_option("--verify", o.verify, "Rebuild the winner and the default this many times in fresh processes and re-measure them")->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-spread", o.max_spread, "Samples spread wider than this fraction of their median (or in two modes) count as a noisy machine");
    cmd->add_option("--seed", o.seed, "Seed for random inputs and random:N");
    cmd->add_option("-o,--output", c->output, "Write the best engine here");
    cmd->add_option("--report", c->report, "Write a report (.json or .md)");
    cmd->add_flag("--dry-run", c->dry_run, "Print the candidate routes and their count; build nothing");
    LlmWorkload& w = c->llm.policy.workload;
    cmd->add_option("--requests", w.requests, "LLM folder: requests of the workload each candidate runs")->check(CLI::PositiveNumber);
    cmd->add_option("--concurrency", w.concurrency, "LLM folder: requests in flight at once")->check(CLI::PositiveNumber);
    cmd->add_option("--input-len", w.input_len, "LLM folder: prompt tokens per request")->check(CLI::PositiveNumber);
    cmd->add_option("--output-len", w.output_len, "LLM folder: generated tokens per request (greedy)")->check(CLI::PositiveNumber);
    cmd->add_option("--min-token-agreement", c->llm.policy.min_agreement, "LLM folder: fraction of the default's greedy tokens a candidate must reproduce")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--tp", c->llm.policy.tp, "LLM folder: tensor-parallel shards (cpu)")->check(CLI::PositiveNumber);
    cmd->add_flag("--json", c->json, "Machine-readable summary");
    cmd->callback([c] { execute(*c); });
}

}  // namespace kiln::tools
