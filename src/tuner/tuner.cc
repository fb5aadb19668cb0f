#include "tuner/tuner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "route/expression.h"
#include "tuner/tuning_cache.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

Golden loadGolden(const Graph& model, const TunerOptions& o) {
    Golden g;
    const auto declared = model.runtimeInputs();
    if (!o.golden_dir.empty()) {
        for (size_t i = 0; i < declared.size(); ++i) {
            fs::path p = fs::path(o.golden_dir) / ("input_" + std::to_string(i) + ".pb");
            if (!fs::exists(p)) p.replace_extension(".npy");
            check(fs::exists(p), "--golden: " + p.string() + " is missing");
            g.inputs[declared[i].name] = loadTensorFile(p);
        }
        for (size_t i = 0; i < model.outputs.size(); ++i) {
            fs::path p = fs::path(o.golden_dir) / ("output_" + std::to_string(i) + ".pb");
            if (!fs::exists(p)) p.replace_extension(".npy");
            check(fs::exists(p), "--golden: " + p.string() + " is missing");
            g.outputs.push_back(loadTensorFile(p));
        }
        g.source = "golden data from " + o.golden_dir;
        return g;
    }
    std::mt19937_64 rng(o.seed);
    std::uniform_real_distribution<double> real(-1, 1);
    for (const auto& vi : declared) {
        check(vi.shape.fullyKnown(), "input '" + vi.name + "' has shape " + vi.shape.toString() + "; give --golden data for models with symbolic dims");
        Tensor t(vi.dtype, vi.shape.concrete());
        dispatchDType(vi.dtype, "golden input", [&](auto tag) {
            using T = typename decltype(tag)::type;
            for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = std::is_integral_v<T> ? static_cast<T>(rng() % 10) : static_cast<T>(real(rng));
        });
        g.inputs[vi.name] = t;
    }
    g.outputs = GraphExecutor(model).run(g.inputs);
    g.source = "seeded random inputs (seed " + std::to_string(o.seed) + "), outputs from the unoptimized f32 reference build";
    return g;
}

std::string defaultExpression(const Graph& model) {
    Builder b(model, "");
    std::string expr;
    for (const auto& p : b.affectingParameters()) expr += p + "=* ";
    return expr + "one-at-a-time";
}

}  // namespace

TuneResult tune(const TunerOptions& o) {
    TuneResult result;
    Graph model = importOnnxModel(o.model_path);
    const std::string model_hash = modelFileHash(o.model_path);
    result.expression = o.expr.empty() ? defaultExpression(model) : o.expr;
    auto routes = expandRouteExpression(result.expression, Builder::space(), o.seed).routes;
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    if (std::find(routes.begin(), routes.end(), def) == routes.end()) routes.insert(routes.begin(), def);  // the baseline is always measured
    Golden golden = loadGolden(model, o);
    result.golden_source = golden.source;
    TuningCache cache(o.cache_path, CacheKey{model_hash, targetSignature("cpu"), KILN_VERSION}, o.resume);
    result.warnings = cache.warnings();
    size_t evaluated = 0;
    double best = 0;
    for (size_t i = 0; i < routes.size(); ++i) {
        CandidateResult r;
        if (const CandidateResult* hit = cache.find(routes[i].hash())) {
            r = *hit;
            ++result.from_cache;
        } else {
            if (o.budget && evaluated >= o.budget) break;
            r = evaluateCandidate(model, model_hash, routes[i], golden, o.tolerance, o.policy);
            cache.append(r);
            ++evaluated;
        }
        if (r.outcome == Outcome::Ok && (best == 0 || r.median_ms < best)) best = r.median_ms;
        result.candidates.push_back(r);
        if (o.progress) o.progress(i + 1, routes.size(), r, best);
    }
    // Finalists: the fastest accurate candidates plus the default, re-measured interleaved.
    std::vector<CandidateResult> ok;
    for (const auto& c : result.candidates)
        if (c.outcome == Outcome::Ok) ok.push_back(c);
    check(!ok.empty(), "no candidate passed the accuracy criterion (" + o.tolerance.metric + " " + std::to_string(o.tolerance.value) + ")");
    std::sort(ok.begin(), ok.end(), [](const auto& a, const auto& b) { return a.median_ms < b.median_ms; });
    std::vector<CandidateResult> finalists(ok.begin(), ok.begin() + static_cast<long>(std::min(o.finalists, ok.size())));
    bool has_default = false;
    for (const auto& f : finalists) has_default |= f.route_hash == def.hash();
    for (const auto& c : ok)
        if (!has_default && c.route_hash == def.hash()) finalists.push_back(c);
    for (auto& f : finalists) f.samples_ms.clear();
    for (int round = 0; round < o.rounds; ++round)
        for (auto& f : finalists) {
            CandidateResult again = evaluateCandidate(model, model_hash, BuildRoute::parse(f.route, Builder::space()), golden, o.tolerance, o.policy);
            if (again.outcome == Outcome::Ok) f.samples_ms.insert(f.samples_ms.end(), again.samples_ms.begin(), again.samples_ms.end());
        }
    for (auto& f : finalists) summarizeSamples(f);
    finalists.erase(std::remove_if(finalists.begin(), finalists.end(), [](const auto& f) { return f.samples_ms.empty(); }), finalists.end());
    check(!finalists.empty(), "every finalist failed when re-measured");
    std::sort(finalists.begin(), finalists.end(), [](const auto& a, const auto& b) { return a.median_ms < b.median_ms; });
    result.finalists = finalists;
    const CandidateResult* dflt = nullptr;
    for (const auto& f : finalists)
        if (f.route_hash == def.hash()) dflt = &f;
    const CandidateResult& winner = finalists.front();
    if (!dflt) {  // the default itself failed: the fastest accurate route wins outright
        result.best_route = winner.route;
        result.significant = true;
        return result;
    }
    result.default_result = *dflt;
    const double gain = dflt->median_ms / winner.median_ms - 1.0;
    const double noise = (dflt->spread + winner.spread) / 2;
    result.significant = winner.route_hash != def.hash() && gain >= o.min_gain && gain > noise;
    result.best_route = result.significant ? winner.route : def.text();
    result.speedup = result.significant ? 1.0 + gain : 1.0;
    return result;
}

void writeTuneReport(const TuneResult& r, const TunerOptions& o, const std::string& path) {
    auto routeChanges = [](const std::string& text) { return BuildRoute::parse(text, Builder::space()).changesText(Builder::space()); };
    std::map<std::string, int> by_outcome;
    for (const auto& c : r.candidates) ++by_outcome[outcomeName(c.outcome)];
    std::ofstream out(path);
    check(out.good(), "--report: cannot write " + path);
    const std::string rebuild = "kiln build " + o.model_path + " -o best.engine --route '" + routeChanges(r.best_route) + "'";
    if (fs::path(path).extension() == ".json") {
        nlohmann::json j = {{"model", o.model_path}, {"expression", r.expression}, {"golden", r.golden_source},
                            {"tolerance", {{"metric", o.tolerance.metric}, {"value", o.tolerance.value}}}, {"outcomes", by_outcome},
                            {"from_cache", r.from_cache}, {"best_route", r.best_route}, {"best_changes", routeChanges(r.best_route)},
                            {"speedup_over_default", r.speedup}, {"significant", r.significant}, {"rebuild_command", rebuild}};
        for (const auto& c : r.candidates)
            j["candidates"].push_back({{"route_hash", c.route_hash}, {"changes", routeChanges(c.route)}, {"outcome", outcomeName(c.outcome)},
                                       {"median_ms", c.median_ms}, {"spread", c.spread}, {"error", c.error}, {"message", c.message}});
        for (const auto& f : r.finalists)
            j["finalists"].push_back({{"changes", routeChanges(f.route)}, {"median_ms", f.median_ms}, {"spread", f.spread}, {"samples", f.samples_ms.size()}});
        out << j.dump(2) << "\n";
        return;
    }
    out << "# Kiln tuning report\n\nModel: `" << o.model_path << "`  \nExpression: `" << r.expression << "`  \nGolden: " << r.golden_source
        << "  \nTolerance: " << o.tolerance.metric << " " << o.tolerance.value << "\n\n## Outcome\n\n";
    for (const auto& [k, v] : by_outcome) out << "- " << k << ": " << v << "\n";
    out << "\nBest route: `" << routeChanges(r.best_route) << "` — " << (r.significant ? "speedup " + std::to_string(r.speedup) + "x over the default" : "no significant gain over the default; the default is kept")
        << "\n\nRebuild: `" << rebuild << "`\n\n## Finalists (re-measured interleaved)\n\n| route | median ms | spread |\n|---|---|---|\n";
    for (const auto& f : r.finalists) out << "| `" << routeChanges(f.route) << "` | " << f.median_ms << " | " << f.spread * 100 << "% |\n";
    out << "\n## All candidates\n\n| route | outcome | median ms | error | note |\n|---|---|---|---|---|\n";
    for (const auto& c : r.candidates)
        out << "| `" << routeChanges(c.route) << "` | " << outcomeName(c.outcome) << " | " << c.median_ms << " | " << c.error << " | " << c.message << " |\n";
}

}  // namespace kiln
