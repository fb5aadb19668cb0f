#include "tuner/tuner.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <unistd.h>

#include "onnx_import/importer.h"
#include "onnx_import/tensor_proto.h"
#include "route/expression.h"
#include "runtime/input_dims.h"
#include "tuner/tuning_cache.h"
#include "tuner/winner.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

constexpr size_t kExhaustiveLimit = 64;

void checkObjective(const TunerOptions& o) {
    check(o.objective == "opt" || o.objective == "geomean", "--objective '" + o.objective + "': expected opt or geomean");
    check(o.objective == "opt" || !o.policy.profile.empty(), "--objective geomean averages over a shape profile; give --minShapes and --maxShapes");
}

// The shapes of one profile point: --shapes, with each profiled input at that point.
std::map<std::string, Dims> pointShapes(const TunerOptions& o, const std::string& point) {
    std::map<std::string, Dims> shapes = o.input_shapes;
    for (const auto& [name, range] : o.policy.profile) shapes[name] = point == "min" ? range.min : point == "max" ? range.max : range.opt;
    return shapes;
}

TensorMap randomInputs(const Graph& model, const std::map<std::string, Dims>& shapes, uint64_t seed, std::string* defaulted) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> real(-1, 1);
    TensorMap inputs;
    for (const auto& vi : model.runtimeInputs()) {
        Tensor t(vi.dtype, randomInputDims(vi, shapes, "--shapes", "--golden data", SymbolicDims::One, defaulted));
        dispatchDType(vi.dtype, "golden input", [&](auto tag) {
            using T = typename decltype(tag)::type;
            for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = std::is_integral_v<T> ? static_cast<T>(rng() % 10) : static_cast<T>(real(rng));
        });
        inputs[vi.name] = t;
    }
    return inputs;
}

std::string shapesText(const TensorMap& inputs) {
    std::string s;
    for (const auto& [name, t] : inputs) s += (s.empty() ? "" : " ") + name + ":" + dimsToString(t.dims());
    return s;
}

// The golden cases: the user's files or seeded random inputs at the profile's opt shapes
// (or without a profile, at --shapes), then random inputs at its min and max shapes where
// they differ. Outputs the user did not give come from the unoptimized f32 reference.
Golden loadGolden(const Graph& model, const TunerOptions& o) {
    Golden g;
    const bool profiled = !o.policy.profile.empty();
    const bool every_point = o.objective == "geomean";
    GoldenCase first;
    first.label = profiled ? "opt" : "";
    std::string defaulted;  // inputs whose symbolic dims were set to 1 (as trtexec does without --shapes)
    if (!o.golden_dir.empty()) {
        const auto declared = model.runtimeInputs();
        auto file = [&](const std::string& stem) {
            fs::path p = fs::path(o.golden_dir) / (stem + ".pb");
            if (!fs::exists(p)) p.replace_extension(".npy");
            check(fs::exists(p), "--golden: " + (fs::path(o.golden_dir) / (stem + ".pb")).string() + " is missing");
            return loadTensorFile(p);
        };
        for (size_t i = 0; i < declared.size(); ++i) first.inputs[declared[i].name] = file("input_" + std::to_string(i));
        for (size_t i = 0; i < model.outputs.size(); ++i) first.outputs.push_back(file("output_" + std::to_string(i)));
        for (const auto& [name, range] : o.policy.profile) {
            auto it = first.inputs.find(name);
            check(it != first.inputs.end(), "--minShapes/--maxShapes name '" + name + "', which is not an input of the model");
            const Dims& d = it->second.dims();
            check(range.contains(d), "--golden: input '" + name + "' has shape " + dimsToString(d) + ", outside the profile " + dimsToString(range.min) + " .. " +
                              dimsToString(range.max));
        }
        g.source = "golden data from " + o.golden_dir;
    } else {
        first.inputs = randomInputs(model, pointShapes(o, "opt"), o.seed, &defaulted);
        first.outputs = GraphExecutor(model).run(first.inputs);
        g.source = "seeded random inputs (seed " + std::to_string(o.seed) + "), golden outputs from the unoptimized f32 reference build";
    }
    g.cases.push_back(std::move(first));
    if (profiled) {
        uint64_t seed = o.seed;
        for (const char* point : {"min", "max"}) {
            GoldenCase c;
            c.label = point;
            c.inputs = randomInputs(model, pointShapes(o, point), ++seed, nullptr);
            c.timed = every_point;
            const std::string shapes = shapesText(c.inputs);
            if (std::any_of(g.cases.begin(), g.cases.end(), [&](const GoldenCase& k) { return shapesText(k.inputs) == shapes; })) continue;
            c.outputs = GraphExecutor(model).run(c.inputs);
            g.cases.push_back(std::move(c));
        }
        g.source += "; checked at the profile's";
        for (const auto& c : g.cases) g.source += " " + c.label + " (" + shapesText(c.inputs) + ")";
        g.source += every_point ? "; timed at all of them (geomean)" : "; timed at opt";
    }
    if (!defaulted.empty()) g.source += "; symbolic dims set to 1 for " + defaulted + " (give --shapes NAME:DIMS to choose)";
    return g;
}

// What the measurements depend on besides the model, target and version: the cached
// results of another objective, other shapes or another tolerance are not reused.
std::string measurementSetup(const Golden& g, const TunerOptions& o) {
    std::string s = "objective " + o.objective + "; tolerance " + o.tolerance.text();
    if (const auto& c = o.policy.calibration) s += "; calibration " + c->method + " over " + std::to_string(c->samples) + " samples, " + std::to_string(c->ranges.size()) + " ranges";
    for (const auto& c : g.cases) s += "; " + (c.label.empty() ? std::string("at") : c.label) + (c.timed ? " (timed) " : " ") + shapesText(c.inputs);
    return s;
}

// Without --expr: every value of each parameter that affects the model. Its cross product
// is usually far too large to list, so it is searched as a domain (mixed by default).
Domain defaultDomain(const Graph& model, const TunerOptions& o, std::string* expression) {
    Builder b(model, o.policy.calibration ? o.policy.calibration->model_hash : "", o.policy.target);
    b.setCalibration(o.policy.calibration);
    Domain d;
    for (const auto& name : b.affectingParameters()) {
        const std::vector<std::string>& all = Builder::space().get(name).values;
        std::vector<std::string> values = b.offeredValues(name);
        if (!o.policy.calibration) values.erase(std::remove(values.begin(), values.end(), "int8"), values.end());  // needs --calib
        std::string term = name + "=*";
        if (values.size() != all.size()) {
            term = name + "=[";
            for (size_t i = 0; i < values.size(); ++i) term += (i ? "," : "") + values[i];
            term += "]";
        }
        d.emplace_back(name, values);
        *expression += (expression->empty() ? "" : " ") + term;
    }
    if (expression->empty()) *expression = "default";
    return d;
}

// Evaluates candidates through the cache and the budget, recording them in order.
class Search {
public:
    Search(const TunerOptions& o, TuneResult& result, const Graph& model, std::string model_hash, const Golden& golden)
        : o_(o), result_(result), model_(model), model_hash_(std::move(model_hash)), golden_(golden),
          cache_(o.cache_path, CacheKey{model_hash_, isolatedTargetSignature(o.policy.target), KILN_VERSION, measurementSetup(golden, o)}, o.resume), start_(std::chrono::steady_clock::now()) {
        result_.warnings = cache_.warnings();
    }

    // One candidate, from the cache when it holds it; nullptr once the budget is spent.
    const CandidateResult* evaluate(const BuildRoute& route, size_t expected_total) {
        const std::string hash = route.hash();
        if (auto it = seen_.find(hash); it != seen_.end()) return &result_.candidates[it->second];
        CandidateResult r;
        bool fresh = false;
        if (const CandidateResult* hit = cache_.find(hash)) {
            r = *hit;
            ++result_.from_cache;
        } else {
            auto prepared = prepared_.find(hash);
            auto remote = remote_done_.find(hash);
            if (budgetSpent() && prepared == prepared_.end() && remote == remote_done_.end()) {
                result_.budget_exhausted = true;
                return nullptr;
            }
            if (remote != remote_done_.end()) {
                r = remote->second;
                remote_done_.erase(remote);
            } else if (prepared != prepared_.end()) {
                const CandidateResult& built = prepared->second.result;
                if (built.outcome == Outcome::Ok && engines_.count(built.engine_id)) {  // validated, and nothing new to time
                    r = built;
                    std::error_code ec;
                    std::filesystem::remove(prepared->second.engine_path, ec);
                } else {
                    r = measurePrepared(prepared->second, golden_, o_.policy);
                }
                prepared_.erase(prepared);
            } else {
                r = measure(route, engines_);
            }
            fresh = true;
        }
        shareTwinSamples(r);
        if (fresh) {
            cache_.append(r);
            ++new_candidates_;
        }
        if (r.outcome == Outcome::Ok && r.same_engine_as.empty() && !r.engine_id.empty()) engines_.emplace(r.engine_id, r.route_hash);
        if (r.outcome == Outcome::Ok && (best_ == 0 || r.median_ms < best_)) best_ = r.median_ms;
        seen_[hash] = result_.candidates.size();
        result_.candidates.push_back(r);
        if (o_.progress) o_.progress(result_.candidates.size(), expected_total, r, best_);
        return &result_.candidates.back();
    }

    // Builds and validates upcoming routes in parallel children (--jobs), within the budget.
    void prefetch(const std::vector<BuildRoute>& routes) {
        if ((o_.jobs <= 1 && !o_.remote_batch) || o_.evaluate_override) return;
        std::vector<BuildRoute> todo;
        for (const auto& r : routes) {
            const std::string h = r.hash();
            if (seen_.count(h) || cache_.find(h) || prepared_.count(h) || remote_done_.count(h)) continue;
            if (o_.budget.candidates && new_candidates_ + prepared_.size() + remote_done_.size() + todo.size() >= o_.budget.candidates) break;
            todo.push_back(r);
        }
        if (todo.empty() || budgetSpent()) return;
        if (o_.remote_batch) {  // distributed: workers build, validate and time
            auto results = o_.remote_batch(todo);
            for (size_t i = 0; i < todo.size() && i < results.size(); ++i)
                if (!results[i].route_hash.empty()) remote_done_[todo[i].hash()] = results[i];  // the rest: measured here
            return;
        }
        std::filesystem::create_directories(work_dir_);
        auto done = prepareCandidates(model_, model_hash_, todo, golden_, o_.tolerance, o_.policy, o_.jobs, work_dir_.string());
        for (size_t i = 0; i < todo.size(); ++i) prepared_[todo[i].hash()] = done[i];
    }

    ~Search() {
        std::error_code ec;
        std::filesystem::remove_all(work_dir_, ec);
    }

    // A finalist's samples for one re-measurement round, cached under their own key so a
    // resumed search reuses them too.
    std::vector<double> remeasure(const CandidateResult& f, int round) {
        const std::string key = "remeasure" + std::to_string(round) + ":" + f.route_hash;
        if (const CandidateResult* hit = cache_.find(key)) return hit->samples_ms;
        CandidateResult r = measure(BuildRoute::parse(f.route, Builder::space()));
        r.route_hash = key;
        cache_.append(r);
        return r.outcome == Outcome::Ok ? r.samples_ms : std::vector<double>{};
    }

    // A new build and measurement, bypassing the cache (--verify).
    CandidateResult measureFresh(const BuildRoute& route) const { return measure(route); }

private:
    CandidateResult measure(const BuildRoute& route, const KnownEngines& known = {}) const {
        if (o_.evaluate_override) return o_.evaluate_override(route);
        CandidateResult r = evaluateCandidate(model_, model_hash_, route, golden_, o_.tolerance, o_.policy, known);
        r.measured_by = "local";
        return r;
    }
    // A candidate that built an engine measured before (here, by a worker, or in the cache)
    // takes that one's samples: the two tie, and ties go to the simpler route.
    void shareTwinSamples(CandidateResult& r) const {
        if (r.outcome != Outcome::Ok || r.engine_id.empty()) return;
        auto twin = engines_.find(r.engine_id);
        if (twin == engines_.end() || twin->second == r.route_hash) return;
        auto at = seen_.find(twin->second);
        if (at == seen_.end()) return;
        const CandidateResult& first = result_.candidates[at->second];
        r.same_engine_as = first.route_hash;
        const bool is_default = first.route_hash == BuildRoute::defaults(Builder::space()).hash();
        r.message = "same engine as " + (is_default ? std::string("the default route") : BuildRoute::parse(first.route, Builder::space()).changesText(Builder::space())) +
                    ": not timed again";
        r.samples_ms = first.samples_ms;
        summarizeSamples(r);
        r.measured_by = first.measured_by;
    }
    bool budgetSpent() const {
        if (o_.budget.candidates && new_candidates_ >= o_.budget.candidates) return true;
        return o_.budget.seconds > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() >= o_.budget.seconds;
    }

    const TunerOptions& o_;
    TuneResult& result_;
    const Graph& model_;
    std::string model_hash_;
    const Golden& golden_;
    TuningCache cache_;
    std::chrono::steady_clock::time_point start_;
    std::map<std::string, size_t> seen_;
    KnownEngines engines_;  // engine identity -> the route hash that measured it
    std::map<std::string, PreparedCandidate> prepared_;
    std::map<std::string, CandidateResult> remote_done_;
    fs::path work_dir_ = fs::temp_directory_path() / ("kiln-tune-" + std::to_string(getpid()));
    size_t new_candidates_ = 0;
    double best_ = 0;
};

}  // namespace

void runTuneWorker(const TunerOptions& o, const std::function<bool(std::string*)>& next, const std::function<void(const CandidateResult&)>& send) {
    Graph model = importOnnxModel(o.model_path);
    const std::string model_hash = modelFileHash(o.model_path);
    Golden golden = loadGolden(model, o);  // same files or the same seed: the same golden data as rank 0
    std::string route_text;
    while (next(&route_text)) send(evaluateCandidate(model, model_hash, BuildRoute::parse(route_text, Builder::space()), golden, o.tolerance, o.policy));
}

Budget Budget::parse(const std::string& text) {
    Budget b;
    if (text.empty()) return b;
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(text, &used);
    } catch (...) {
        used = 0;
    }
    const std::string unit = text.substr(used);
    check(used > 0 && v > 0, "--budget '" + text + "': expected a candidate count (40) or a time (90s, 10m, 1h)");
    if (unit.empty()) b.candidates = static_cast<size_t>(v);
    else if (unit == "s") b.seconds = v;
    else if (unit == "m") b.seconds = v * 60;
    else if (unit == "h") b.seconds = v * 3600;
    else throw Error("--budget '" + text + "': unknown unit '" + unit + "' (s, m, h)");
    return b;
}

TunePlan planTune(const TunerOptions& o, const Graph& model) {
    checkObjective(o);
    TunePlan plan;
    Domain domain;
    double combinations = 1;
    std::vector<BuildRoute> routes;
    if (o.expr.empty()) {
        domain = defaultDomain(model, o, &plan.expression);
        for (const auto& [name, values] : domain) combinations *= static_cast<double>(values.size());
        if (combinations <= kExhaustiveLimit) routes = expandRouteExpression(plan.expression, Builder::space(), o.seed).routes;
    } else {
        plan.expression = o.expr;
        routes = expandRouteExpression(o.expr, Builder::space(), o.seed).routes;
        domain = domainOf(routes, Builder::space());
        combinations = static_cast<double>(routes.size());
    }
    const Strategy strategy = o.strategy.value_or(combinations <= kExhaustiveLimit ? Strategy::Exhaustive : Strategy::Mixed);
    check(strategy != Strategy::Exhaustive || !routes.empty() || combinations <= kExhaustiveLimit,
          "--strategy exhaustive: the default search space has " + std::to_string(static_cast<long long>(combinations)) +
              " routes; give --expr to narrow it, or use greedy or mixed");
    plan.strategy = strategyName(strategy);
    plan.combinations = combinations;
    plan.domain = domain;
    if (strategy == Strategy::Exhaustive) {  // the default is always measured first
        const BuildRoute def = BuildRoute::defaults(Builder::space());
        plan.routes = {def};
        for (const auto& r : routes)
            if (r.hash() != def.hash()) plan.routes.push_back(r);
        return plan;
    }
    plan.adaptive = true;
    plan.routes = oneAtATimeRoutes(domain, Builder::space());
    plan.rule = strategy == Strategy::Mixed ? "phase 2: every combination of the values that beat the default in phase 1 (accurate candidates only)"
                                            : "greedy: parameters in order, each value tried from the fastest route so far, in two passes; once a value wins, "
                                              "the later routes of phase 1 start from it";
    return plan;
}

TuneResult tune(const TunerOptions& o) {
    checkObjective(o);
    TuneResult result;
    Graph model = importOnnxModel(o.model_path);
    const TunePlan plan = planTune(o, model);
    result.expression = plan.expression;
    result.strategy = plan.strategy;
    const Strategy strategy = parseStrategy(plan.strategy);
    const Domain& domain = plan.domain;
    const std::vector<BuildRoute>& routes = plan.routes;
    Golden golden = loadGolden(model, o);
    result.golden_source = golden.source;
    Search search(o, result, model, modelFileHash(o.model_path), golden);
    const BuildRoute def = BuildRoute::defaults(Builder::space());
    const size_t total = strategy == Strategy::Exhaustive ? routes.size() : 0;  // routes holds the default
    Evaluator evaluate{[&](const BuildRoute& r) { return search.evaluate(r, total); }, [&](const std::vector<BuildRoute>& r) { search.prefetch(r); }};
    if (evaluate.evaluate(def)) {  // the baseline is always measured first
        if (strategy == Strategy::Exhaustive) searchExhaustive(routes, evaluate);
        else if (strategy == Strategy::Greedy) searchGreedy(domain, Builder::space(), evaluate);
        else searchMixed(domain, Builder::space(), evaluate);
    }
    chooseWinner(
        result, o, [&](const CandidateResult& c, int round) { return search.remeasure(c, round); },
        [&](const BuildRoute& r) { return search.measureFresh(r); });
    return result;
}

}  // namespace kiln
