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

#include "runtime/accuracy.h"
#include "runtime/context.h"

namespace kiln {

namespace {
const char* kOutcomeNames[] = {"ok", "build_error", "crash", "timeout", "accuracy_fail"};

// Runs in the child: build, check accuracy, time. Returns the JSON result text.
std::string evaluateInChild(const Graph& model, const std::string& model_hash, const BuildRoute& route, const Golden& golden,
                            const Tolerance& tol, const MeasurePolicy& policy) {
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
        double worst = tol.metric == "cosine" ? 1.0 : 0.0;
        bool within = outputs.size() == golden.outputs.size();
        for (size_t i = 0; within && i < outputs.size(); ++i) {
            ErrorStats s = compareOutputs(outputs[i], golden.outputs[i], engine.graph.outputs[i].name);
            double v = tol.metric == "max-abs" ? s.max_abs : (tol.metric == "cosine" ? s.cosine : s.rel_l2);
            if (s.nan_mismatch || std::isnan(v)) v = tol.metric == "cosine" ? -1 : INFINITY;
            worst = tol.metric == "cosine" ? std::min(worst, v) : std::max(worst, v);
            within &= tol.metric == "cosine" ? v >= tol.value : v <= tol.value;
        }
        if (!within)
            return nlohmann::json{{"outcome", "accuracy_fail"}, {"error", worst},
                                  {"message", tol.metric + " " + std::to_string(worst) + " misses the tolerance " + std::to_string(tol.value)}}.dump();
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

Tolerance Tolerance::parse(const std::string& text) {
    auto eq = text.find('=');
    check(eq != std::string::npos, "--tolerance '" + text + "': expected METRIC=VALUE, e.g. rel-l2=1e-3");
    Tolerance t;
    t.metric = text.substr(0, eq);
    check(t.metric == "max-abs" || t.metric == "rel-l2" || t.metric == "cosine", "--tolerance: unknown metric '" + t.metric + "' (max-abs, rel-l2, cosine)");
    try {
        t.value = std::stod(text.substr(eq + 1));
    } catch (...) {
        throw Error("--tolerance '" + text + "': '" + text.substr(eq + 1) + "' is not a number");
    }
    return t;
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
                                  const Tolerance& tolerance, const MeasurePolicy& policy) {
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
