#include "tuner/candidate.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/accuracy.h"
#include "runtime/context.h"

namespace kiln {

namespace {
const char* kOutcomeNames[] = {"ok", "build_error", "crash", "timeout", "accuracy_fail"};

// In a child: builds the route and checks it against the golden data at each case. Returns
// "" and sets *engine and *error (the metric of the output nearest its tolerance) when it
// passes, else the JSON result that ends the candidate.
std::string buildAndValidate(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                             const AccuracyCriterion& accuracy, const MeasurePolicy& policy, Engine* engine, double* error) {
    try {
        Builder b(model, model_hash, policy.target);
        b.setCalibration(policy.calibration);
        b.setBuildRoute(route);
        if (!policy.profile.empty()) b.setShapeProfile(policy.profile);
        *engine = b.build();
    } catch (const std::exception& e) {
        return nlohmann::json{{"outcome", "build_error"}, {"message", e.what()}}.dump();
    }
    try {
        ExecutionContext ctx(*engine);
        double closest = -1;
        for (const GoldenCase& c : golden.cases) {
            const std::string at = c.label.empty() || golden.cases.size() == 1 ? "" : " at the " + c.label + " shapes";
            auto outputs = ctx.run(c.inputs);
            check(outputs.size() == c.outputs.size(), "the engine has " + std::to_string(outputs.size()) + " outputs, the golden data " + std::to_string(c.outputs.size()));
            for (size_t i = 0; i < outputs.size(); ++i) {
                const std::string& name = engine->graph.outputs[i].name;
                const Tolerance& tol = accuracy.forOutput(name);
                const double v = tol.measure(outputs[i], c.outputs[i], name);
                if (tol.usedFraction(v) > closest) closest = tol.usedFraction(v), *error = v;  // the passing output nearest its limit
                if (!tol.passes(v))
                    return nlohmann::json{{"outcome", "accuracy_fail"}, {"error", v},
                                          {"message", "output " + name + at + ": " + tol.metric + " " + std::to_string(v) + " misses the tolerance " + tol.text()}}.dump();
            }
        }
    } catch (const std::exception& e) {
        return nlohmann::json{{"outcome", "crash"}, {"message", std::string("run failed: ") + e.what()}}.dump();
    }
    return "";
}

// In a child: warm-up and timed runs of a validated engine. With several timed cases (the
// geomean objective) each iteration runs every case once and its sample is the geometric
// mean of their times, so the statistics downstream see one number per iteration. The
// result carries `engine_id` when one is given.
std::string timeEngine(const Engine& engine, const Golden& golden, const MeasurePolicy& policy, double error, const std::string& engine_id = "") {
    try {
        ExecutionContext ctx(engine);
        std::vector<const GoldenCase*> timed;
        for (const auto& c : golden.cases)
            if (c.timed) timed.push_back(&c);
        check(!timed.empty(), "no golden case is timed");
        auto timeOnce = [&](const GoldenCase& c) {
            auto t0 = std::chrono::steady_clock::now();
            ctx.run(c.inputs);
            const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            return ctx.stats().gpu ? ctx.stats().gpu_compute_ms : wall;  // GPU: compute by device events
        };
        for (const GoldenCase* c : timed)
            for (int i = 0; i < policy.warmup + 1; ++i) ctx.run(c->inputs);  // +1: the first run at a shape plans its arena
        std::vector<double> samples;
        for (int i = 0; i < policy.iterations; ++i) {
            double log_sum = 0;
            for (const GoldenCase* c : timed) log_sum += std::log(std::max(timeOnce(*c), 1e-9));
            samples.push_back(std::exp(log_sum / static_cast<double>(timed.size())));
        }
        nlohmann::json j = {{"outcome", "ok"}, {"error", error}, {"samples_ms", samples}};
        if (!engine_id.empty()) j["engine_id"] = engine_id;
        return j.dump();
    } catch (const std::exception& e) {
        return nlohmann::json{{"outcome", "crash"}, {"message", std::string("run failed: ") + e.what()}}.dump();
    }
}

std::string evaluateInChild(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                            const AccuracyCriterion& accuracy, const MeasurePolicy& policy, const KnownEngines& known) {
    Engine engine;
    double error = 0;
    std::string failed = buildAndValidate(model, model_hash, route, golden, accuracy, policy, &engine, &error);
    if (!failed.empty()) return failed;
    const std::string id = Builder::engineIdentity(engine);
    if (auto twin = known.find(id); twin != known.end())
        return nlohmann::json{{"outcome", "ok"}, {"error", error}, {"engine_id", id}, {"same_engine_as", twin->second}}.dump();
    return timeEngine(engine, golden, policy, error, id);
}

// A forked child whose result arrives as text on a pipe.
struct Child {
    pid_t pid = -1;
    int fd = -1;
    std::chrono::steady_clock::time_point deadline;
    std::string text;
};

Child spawn(const std::function<std::string()>& work, double timeout_s) {
    int fds[2];
    check(pipe(fds) == 0, "cannot create a pipe for the candidate process");
    Child c;
    c.pid = fork();
    check(c.pid >= 0, "cannot fork a candidate process");
    if (c.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed tuner takes its candidate with it
        for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, SIG_DFL);  // no inherited crash handlers (e.g. MPI's)
        if (getppid() == 1) _exit(1);      // the tuner died before prctl took effect
        close(fds[0]);
        std::string out = work();
        for (size_t done = 0; done < out.size();) {
            ssize_t n = write(fds[1], out.data() + done, out.size() - done);
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    c.fd = fds[0];
    c.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
    return c;
}

// Waits for children (reading their pipes together), kills those past their deadline and
// turns each into a result: the child's JSON, or timeout / crash.
void collect(std::vector<Child>& children, std::vector<CandidateResult>& results, double timeout_s) {
    std::vector<bool> open(children.size(), true), timed_out(children.size(), false);
    char buf[65536];
    while (std::find(open.begin(), open.end(), true) != open.end()) {
        std::vector<pollfd> fds;
        std::vector<size_t> which;
        const auto now = std::chrono::steady_clock::now();
        for (size_t i = 0; i < children.size(); ++i) {
            if (!open[i]) continue;
            if (now >= children[i].deadline) {
                timed_out[i] = true;
                open[i] = false;
                continue;
            }
            fds.push_back({children[i].fd, POLLIN, 0});
            which.push_back(i);
        }
        if (fds.empty()) break;
        if (poll(fds.data(), fds.size(), 200) <= 0) continue;
        for (size_t k = 0; k < fds.size(); ++k) {
            if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t n = read(fds[k].fd, buf, sizeof buf);
            if (n <= 0) open[which[k]] = false;  // EOF: finished or died
            else children[which[k]].text.append(buf, static_cast<size_t>(n));
        }
    }
    for (size_t i = 0; i < children.size(); ++i) {
        Child& c = children[i];
        close(c.fd);
        if (timed_out[i]) kill(c.pid, SIGKILL);
        int status = 0;
        waitpid(c.pid, &status, 0);
        CandidateResult& r = results[i];
        if (timed_out[i]) {
            r.outcome = Outcome::Timeout;
            r.message = "exceeded " + std::to_string(timeout_s) + " s";
        } else if (WIFSIGNALED(status)) {
            r.outcome = Outcome::Crash;
            r.message = std::string("killed by signal ") + strsignal(WTERMSIG(status));
        } else {
            try {
                auto j = nlohmann::json::parse(c.text);
                r.outcome = parseOutcome(j.at("outcome"));
                r.message = j.value("message", "");
                r.error = j.value("error", 0.0);
                if (j.contains("samples_ms")) r.samples_ms = j["samples_ms"].get<std::vector<double>>();
                r.engine_id = j.value("engine_id", r.engine_id);  // timing a prepared engine keeps its identity
                r.same_engine_as = j.value("same_engine_as", "");
            } catch (const std::exception&) {
                r.outcome = Outcome::Crash;
                r.message = "the candidate process exited without a result";
            }
        }
        summarizeSamples(r);
    }
}

}  // namespace

std::string outcomeName(Outcome o) { return kOutcomeNames[static_cast<int>(o)]; }

Outcome parseOutcome(const std::string& name) {
    for (int i = 0; i < 5; ++i)
        if (name == kOutcomeNames[i]) return static_cast<Outcome>(i);
    throw Error("unknown candidate outcome '" + name + "'");
}

Tolerance Tolerance::parse(const std::string& spec, std::string* output) {
    std::string text = spec;
    const auto colon = text.rfind(':');
    if (colon != std::string::npos) {
        check(output != nullptr && colon > 0, "--tolerance '" + spec + "': an OUTPUT: prefix is not allowed here");
        *output = text.substr(0, colon);
        text = text.substr(colon + 1);
    }
    auto eq = text.find('=');
    check(eq != std::string::npos, "--tolerance '" + spec + "': expected [OUTPUT:]METRIC=VALUE, e.g. rel-l2=1e-3 or logits:top-k=5");
    Tolerance t;
    t.metric = text.substr(0, eq);
    check(t.metric == "max-abs" || t.metric == "rel-l2" || t.metric == "cosine" || t.metric == "top-k",
          "--tolerance: unknown metric '" + t.metric + "' (max-abs, rel-l2, cosine, top-k)");
    try {
        size_t used = 0;
        t.value = std::stod(text.substr(eq + 1), &used);
        check(used == text.size() - eq - 1, "");
    } catch (...) {
        throw Error("--tolerance '" + spec + "': '" + text.substr(eq + 1) + "' is not a number");
    }
    check(t.metric != "top-k" || (t.value >= 1 && t.value == std::floor(t.value)), "--tolerance '" + spec + "': top-k needs a whole K >= 1");
    return t;
}

bool Tolerance::passes(double v) const {
    if (metric == "cosine") return v >= value;
    if (metric == "top-k") return v >= 1.0;  // every row agrees
    return v <= value;
}

double Tolerance::usedFraction(double v) const {
    if (metric == "top-k") return 1.0 - v;                      // the fraction of rows that disagree
    if (metric == "cosine") return value < 1 ? (1.0 - v) / (1.0 - value) : (v >= 1 ? 0.0 : INFINITY);
    return value > 0 ? v / value : (v <= 0 ? 0.0 : INFINITY);
}

double Tolerance::worstOf(double a, double b) const { return (metric == "cosine" || metric == "top-k") ? std::min(a, b) : std::max(a, b); }

double Tolerance::measure(const Tensor& got, const Tensor& want, const std::string& name) const {
    if (metric == "top-k") return topKAgreement(got, want, static_cast<int64_t>(value), name);
    ErrorStats s = compareOutputs(got, want, name);
    double v = metric == "max-abs" ? s.max_abs : (metric == "cosine" ? s.cosine : s.rel_l2);
    if (s.nan_mismatch || std::isnan(v)) v = metric == "cosine" ? -1 : INFINITY;
    return v;
}

std::string Tolerance::text() const {
    std::ostringstream s;
    s << metric << "=" << value;
    return s.str();
}

AccuracyCriterion AccuracyCriterion::parse(const std::vector<std::string>& specs) {
    AccuracyCriterion c;
    for (const auto& spec : specs) {
        std::string output;
        Tolerance t = Tolerance::parse(spec, &output);
        if (output.empty()) c.fallback = t;
        else c.per_output[output] = t;
    }
    return c;
}

const Tolerance& AccuracyCriterion::forOutput(const std::string& name) const {
    auto it = per_output.find(name);
    return it == per_output.end() ? fallback : it->second;
}

std::string AccuracyCriterion::text() const {
    std::string s = fallback.text();
    for (const auto& [name, t] : per_output) s += ", " + name + ": " + t.text();
    return s;
}

std::string candidateToJson(const CandidateResult& r, const std::map<std::string, std::string>& extra) {
    nlohmann::json j = {{"route_hash", r.route_hash}, {"route", r.route},   {"outcome", outcomeName(r.outcome)}, {"message", r.message},
                        {"error", r.error},           {"samples_ms", r.samples_ms}, {"measured_by", r.measured_by}};
    if (!r.engine_id.empty()) j["engine_id"] = r.engine_id;
    if (!r.same_engine_as.empty()) j["same_engine_as"] = r.same_engine_as;
    for (const auto& [k, v] : extra) j[k] = v;
    return j.dump();
}

CandidateResult candidateFromJson(const std::string& text) {
    auto j = nlohmann::json::parse(text);
    CandidateResult r;
    r.route = j.at("route");
    r.route_hash = j.at("route_hash");
    r.outcome = parseOutcome(j.at("outcome"));
    r.message = j.value("message", "");
    r.error = j.value("error", 0.0);
    r.samples_ms = j.value("samples_ms", std::vector<double>{});
    r.measured_by = j.value("measured_by", "");
    r.engine_id = j.value("engine_id", "");
    r.same_engine_as = j.value("same_engine_as", "");
    summarizeSamples(r);
    return r;
}

void summarizeSamples(CandidateResult& r) {
    if (r.samples_ms.empty()) return;
    std::vector<double> s = r.samples_ms;
    std::sort(s.begin(), s.end());
    auto at = [&](double p) { return s[static_cast<size_t>(std::lround(p * static_cast<double>(s.size() - 1)))]; };
    r.median_ms = at(0.5);
    r.spread = r.median_ms > 0 ? (at(0.9) - at(0.1)) / r.median_ms : 0;
}

CandidateResult evaluateCandidate(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                                  const AccuracyCriterion& tolerance, const MeasurePolicy& policy, const KnownEngines& known) {
    std::vector<Child> child = {spawn([&] { return evaluateInChild(model, model_hash, route, golden, tolerance, policy, known); }, policy.timeout_s)};
    std::vector<CandidateResult> result(1);
    result[0].route = route.text();
    result[0].route_hash = route.hash();
    collect(child, result, policy.timeout_s);
    return result[0];
}

std::vector<PreparedCandidate> prepareCandidates(const Graph& model, const std::string& model_hash, const std::vector<BuildRoute>& routes, const Golden& golden,
                                                 const AccuracyCriterion& accuracy, const MeasurePolicy& policy, size_t jobs, const std::string& work_dir) {
    std::vector<PreparedCandidate> out(routes.size());
    for (size_t start = 0; start < routes.size(); start += std::max<size_t>(jobs, 1)) {
        const size_t end = std::min(routes.size(), start + std::max<size_t>(jobs, 1));
        std::vector<Child> children;
        std::vector<CandidateResult> results(end - start);
        for (size_t i = start; i < end; ++i) {
            out[i].engine_path = work_dir + "/" + routes[i].hash() + ".engine";
            const std::string path = out[i].engine_path;
            results[i - start].route = routes[i].text();
            results[i - start].route_hash = routes[i].hash();
            children.push_back(spawn(
                [&, i, path] {
                    Engine engine;
                    double error = 0;
                    std::string failed = buildAndValidate(model, model_hash, routes[i], golden, accuracy, policy, &engine, &error);
                    if (!failed.empty()) return failed;
                    writeEngine(engine, path);
                    // validated; timing comes later, alone
                    return nlohmann::json{{"outcome", "ok"}, {"error", error}, {"engine_id", Builder::engineIdentity(engine)}}.dump();
                },
                policy.timeout_s));
        }
        collect(children, results, policy.timeout_s);
        for (size_t i = start; i < end; ++i) out[i].result = results[i - start];
    }
    return out;
}

CandidateResult measurePrepared(const PreparedCandidate& p, const Golden& golden, const MeasurePolicy& policy) {
    CandidateResult r = p.result;
    if (r.outcome != Outcome::Ok) return r;
    std::vector<Child> child = {spawn([&] { return timeEngine(readEngine(p.engine_path), golden, policy, r.error); }, policy.timeout_s)};
    std::vector<CandidateResult> result = {r};
    collect(child, result, policy.timeout_s);
    std::error_code ec;
    std::filesystem::remove(p.engine_path, ec);
    return result[0];
}

std::string isolatedTargetSignature(const std::string& target) {
    if (target != "cuda") return targetSignature(target);
    std::vector<Child> child = {spawn([&] {
        try {
            return nlohmann::json{{"outcome", "ok"}, {"message", targetSignature(target)}}.dump();
        } catch (const std::exception& e) {
            return nlohmann::json{{"outcome", "build_error"}, {"message", e.what()}}.dump();
        }
    }, 60)};
    std::vector<CandidateResult> result(1);
    collect(child, result, 60);
    check(result[0].outcome == Outcome::Ok, result[0].message.empty() ? "target cuda: the device check failed" : result[0].message);
    return result[0].message;
}

}  // namespace kiln
