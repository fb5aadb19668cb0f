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
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/accuracy.h"
#include "runtime/context.h"

namespace kiln {

namespace {
const char* kOutcomeNames[] = {"ok", "build_error", "crash", "timeout", "accuracy_fail"};

// Runs in the child: build, check accuracy, time. Returns the JSON result text.
std::string evaluateInChild(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                            const AccuracyCriterion& accuracy, const MeasurePolicy& policy) {
    nlohmann::json j;
    Engine engine;
    try {
        Builder b(model, model_hash);
        b.setBuildRoute(route);
        engine = b.build();
    } catch (const std::exception& e) {
        return nlohmann::json{{"outcome", "build_error"}, {"message", e.what()}}.dump();
    }
    try {
        ExecutionContext ctx(engine);
        auto outputs = ctx.run(golden.inputs);
        check(outputs.size() == golden.outputs.size(), "the engine has " + std::to_string(outputs.size()) + " outputs, the golden data " + std::to_string(golden.outputs.size()));
        double worst = 0;
        for (size_t i = 0; i < outputs.size(); ++i) {
            const std::string& name = engine.graph.outputs[i].name;
            const Tolerance& tol = accuracy.forOutput(name);
            const double v = tol.measure(outputs[i], golden.outputs[i], name);
            worst = i == 0 ? v : tol.worstOf(worst, v);
            if (!tol.passes(v))
                return nlohmann::json{{"outcome", "accuracy_fail"}, {"error", v},
                                      {"message", "output " + name + ": " + tol.metric + " " + std::to_string(v) + " misses the tolerance " + tol.text()}}.dump();
        }
        for (int i = 0; i < policy.warmup; ++i) ctx.run(golden.inputs);
        std::vector<double> samples;
        for (int i = 0; i < policy.iterations; ++i) {
            auto t0 = std::chrono::steady_clock::now();
            ctx.run(golden.inputs);
            samples.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        return nlohmann::json{{"outcome", "ok"}, {"error", worst}, {"samples_ms", samples}}.dump();
    } catch (const std::exception& e) {
        return nlohmann::json{{"outcome", "crash"}, {"message", std::string("run failed: ") + e.what()}}.dump();
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

void summarizeSamples(CandidateResult& r) {
    if (r.samples_ms.empty()) return;
    std::vector<double> s = r.samples_ms;
    std::sort(s.begin(), s.end());
    auto at = [&](double p) { return s[static_cast<size_t>(std::lround(p * static_cast<double>(s.size() - 1)))]; };
    r.median_ms = at(0.5);
    r.spread = r.median_ms > 0 ? (at(0.9) - at(0.1)) / r.median_ms : 0;
}

CandidateResult evaluateCandidate(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                                  const AccuracyCriterion& tolerance, const MeasurePolicy& policy) {
    CandidateResult r;
    r.route = route.text();
    r.route_hash = route.hash();
    int fds[2];
    check(pipe(fds) == 0, "cannot create a pipe for the candidate process");
    const pid_t pid = fork();
    check(pid >= 0, "cannot fork a candidate process");
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed tuner takes its candidate with it
        if (getppid() == 1) _exit(1);      // the tuner died before prctl took effect
        close(fds[0]);
        std::string out = evaluateInChild(model, model_hash, route, golden, tolerance, policy);
        for (size_t done = 0; done < out.size();) {
            ssize_t n = write(fds[1], out.data() + done, out.size() - done);
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        close(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(policy.timeout_s);
    bool timed_out = false;
    char buf[65536];
    while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{fds[0], POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0) break;  // EOF: the child finished or died
        text.append(buf, static_cast<size_t>(n));
    }
    close(fds[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (timed_out) {
        r.outcome = Outcome::Timeout;
        r.message = "exceeded " + std::to_string(policy.timeout_s) + " s";
        return r;
    }
    if (WIFSIGNALED(status)) {
        r.outcome = Outcome::Crash;
        r.message = std::string("killed by signal ") + strsignal(WTERMSIG(status));
        return r;
    }
    try {
        auto j = nlohmann::json::parse(text);
        r.outcome = parseOutcome(j.at("outcome"));
        r.message = j.value("message", "");
        r.error = j.value("error", 0.0);
        if (j.contains("samples_ms")) r.samples_ms = j["samples_ms"].get<std::vector<double>>();
    } catch (const std::exception&) {
        r.outcome = Outcome::Crash;
        r.message = "the candidate process exited without a result";
    }
    summarizeSamples(r);
    return r;
}

}  // namespace kiln
