#include "tools/cmd_tune_llm.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ir/error.h"
#include "llm/llm_parameters.h"
#include "llm/model_loader.h"

namespace kiln::tools {

namespace {

nlohmann::json resultJson(const LlmTuneCommand& c, const LlmTuneResult& r) {
    nlohmann::json cands = nlohmann::json::array();
    for (const auto& cand : r.candidates) {
        nlohmann::json j{{"changes", cand.changes}, {"route_hash", cand.route.hash()}, {"median_ms", cand.median_ms}, {"token_agreement", cand.agreement},
                         {"speedup", cand.speedup.estimate}, {"speedup_interval", {cand.speedup.low, cand.speedup.high}}};
        if (!cand.rejected.empty()) j["rejected"] = cand.rejected;
        cands.push_back(j);
    }
    const auto& w = c.policy.workload;
    const LlmCandidate& best = r.candidates[r.winner];
    return {{"model", c.model},
            {"target", c.policy.target},
            {"objective", r.objective},
            {"expression", r.expression},
            {"workload", {{"requests", w.requests}, {"concurrency", w.concurrency}, {"input_len", w.input_len}, {"output_len", w.output_len}}},
            {"rounds", c.policy.rounds},
            {"candidates", cands},
            {"best_route", best.route.text()},
            {"best_changes", best.changes},
            {"speedup_over_default", best.speedup.estimate},
            {"speedup_interval", {best.speedup.low, best.speedup.high}},
            {"significant", r.significant},
            {"noise", r.noise}};
}

}  // namespace

void executeLlmTune(const LlmTuneCommand& c) {
    const LlmTunePolicy& p = c.policy;
    check(p.min_agreement >= 0 && p.min_agreement <= 1, "--min-token-agreement must be in [0, 1]");
    if (c.dry_run) {
        std::string expr;
        const auto routes = planLlmTune(p, &expr);
        if (c.json) {
            nlohmann::json j = nlohmann::json::array();
            for (const auto& r : routes) j.push_back({{"route_hash", r.hash()}, {"changes", r.changesText(llm::llmSpace())}});
            std::cout << nlohmann::json{{"expression", expr}, {"objective", p.objective}, {"routes", j}}.dump(2) << "\n";
            return;
        }
        for (const auto& r : routes) std::cout << r.hash() << "  " << r.changesText(llm::llmSpace()) << "\n";
        std::cout << routes.size() << " candidate routes over '" << expr << "' (dry run: nothing loaded), each timed on the workload in " << p.rounds
                  << " interleaved rounds\n";
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::function<void(size_t, size_t)> progress;
    if (isatty(STDERR_FILENO) && !c.json)
        progress = [&](size_t done, size_t total) {
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const double eta = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
            const int width = 30, filled = static_cast<int>(width * done / total);
            std::fprintf(stderr, "\r[%s%s] %zu/%zu  ETA %ds ", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done, total, static_cast<int>(eta));
        };
    const LlmTuneResult r = tuneLlm(p, [&](const BuildRoute& route) { return llm::loadLanguageModel(c.model, p.target, p.tp, llm::llmRuntimeOptions(route)); }, progress);
    if (progress) std::fprintf(stderr, "\n");
    const nlohmann::json j = resultJson(c, r);
    if (!c.report.empty()) {
        std::ofstream out(c.report);
        check(out.good(), "--report: cannot write " + c.report);
        out << j.dump(2) << "\n";
    }
    if (c.json) {
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    std::printf("searched %zu LLM routes over '%s', objective %s (ms), %d interleaved rounds\n", r.candidates.size(), r.expression.c_str(), r.objective.c_str(), p.rounds);
    for (const auto& cand : r.candidates)
        std::printf("  %-48s median %8.3f ms  %.3fx [%.3f, %.3f]  tokens %3.0f%%%s\n", cand.changes.c_str(), cand.median_ms, cand.speedup.estimate, cand.speedup.low,
                    cand.speedup.high, cand.agreement * 100, cand.rejected.empty() ? "" : ("  rejected: " + cand.rejected).c_str());
    const LlmCandidate& best = r.candidates[r.winner];
    if (r.significant)
        std::printf("best route: %s — %.2fx faster than the default (95%% interval %.2f-%.2fx)\n", best.changes.c_str(), best.speedup.estimate, best.speedup.low, best.speedup.high);
    else if (!r.noise.empty()) std::printf("the timing stayed noisy (%s); keeping the default route\n", r.noise.c_str());
    else std::printf("no significant gain over the default route (an interval must clear %.0f%%); keeping the default\n", p.min_gain * 100);
}

}  // namespace kiln::tools
