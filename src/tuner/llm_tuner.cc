#include "tuner/llm_tuner.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "ir/error.h"
#include "llm/llm_parameters.h"
#include "route/expression.h"

namespace kiln {

LlmRun runLlmWorkload(const llm::LanguageModel& model, const llm::SchedulerOptions& scheduler, const LlmWorkload& w) {
    check(w.requests > 0 && w.concurrency > 0 && w.input_len > 0 && w.output_len > 0, "the LLM workload needs positive requests, concurrency, input and output lengths");
    llm::SchedulerOptions options = scheduler;
    options.max_batch_size = w.max_batch_size;
    options.num_blocks = w.num_blocks;
    llm::Scheduler sched(model, options);
    std::mt19937_64 rng(w.seed);
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto now_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
    std::vector<int64_t> ids;
    std::map<int64_t, size_t> index_of;
    std::vector<double> added(w.requests, 0);
    std::vector<std::vector<double>> token_ms(w.requests);
    sched.on_token = [&](int64_t id, int64_t) { token_ms[index_of.at(id)].push_back(now_ms()); };
    int64_t next = 0, in_flight = 0, done = 0;
    while (done < w.requests) {
        for (; next < w.requests && in_flight < w.concurrency; ++next, ++in_flight) {
            llm::Request r;
            for (int64_t k = 0; k < w.input_len; ++k) r.prompt.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(model.config().vocab)));
            r.max_tokens = w.output_len;
            r.ignore_eos = true;  // fixed lengths, so every candidate does the same work
            added[next] = now_ms();
            const int64_t id = sched.add(r);
            index_of[id] = static_cast<size_t>(next);
            ids.push_back(id);
        }
        const bool more = sched.step();
        in_flight = done = 0;
        for (int64_t id : ids) (sched.state(id).finished == llm::FinishReason::None ? in_flight : done) += 1;
        check(more || done == static_cast<int64_t>(ids.size()), "the LLM workload stalled: the scheduler has nothing to run but requests are unfinished");
    }
    LlmRun run;
    const double total_ms = now_ms();
    int64_t tokens = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
        const auto& state = sched.state(ids[i]);
        check(state.error.empty(), [&] { return "an LLM workload request failed: " + state.error; });
        run.tokens.push_back(state.output);
        const auto& t = token_ms[i];
        tokens += static_cast<int64_t>(t.size());
        if (!t.empty()) run.ttft_ms.push_back(t.front() - added[i]);
        if (t.size() > 1) run.tpot_ms.push_back((t.back() - t.front()) / static_cast<double>(t.size() - 1));
    }
    run.ms_per_output_token = tokens ? total_ms / static_cast<double>(tokens) : 0;
    return run;
}

double tokenAgreement(const std::vector<std::vector<int64_t>>& reference, const std::vector<std::vector<int64_t>>& got) {
    size_t total = 0, same = 0;
    for (size_t r = 0; r < reference.size(); ++r) {
        total += reference[r].size();
        if (r >= got.size()) continue;
        for (size_t i = 0; i < reference[r].size() && i < got[r].size() && reference[r][i] == got[r][i]; ++i) ++same;
    }
    return total ? static_cast<double>(same) / static_cast<double>(total) : 1.0;
}

namespace {

// The parameters that apply on a target, for expressions without assignments.
ParameterSpace targetSpace(const std::string& target) {
    std::vector<ParameterSpec> specs;
    for (const auto& p : llm::llmSpace().parameters())
        if (!p.hidden && llm::llmParameterApplies(p.name, target)) specs.push_back(p);
    return ParameterSpace(specs);
}

size_t changeCount(const BuildRoute& route) {
    size_t n = 0;
    for (const auto& p : llm::llmSpace().parameters()) n += route.get(p.name) != p.default_value;
    return n;
}

// What a model is made with: a candidate that differs only in scheduler settings reuses it.
std::string loadKey(const BuildRoute& route) {
    std::string key;
    for (const auto& [name, value] : route.values())
        if (name.starts_with("llm.cuda.")) key += name + "=" + value + ";";
    return key;
}

std::vector<double> objectiveSamples(const LlmRun& run, const std::string& objective) {
    if (objective == "ttft") return run.ttft_ms;
    if (objective == "throughput") return {run.ms_per_output_token};
    return run.tpot_ms.empty() ? std::vector<double>{run.ms_per_output_token} : run.tpot_ms;
}

}  // namespace

std::vector<BuildRoute> planLlmTune(const LlmTunePolicy& policy, std::string* expression) {
    const std::string expr = policy.expr.empty() ? "one-at-a-time" : policy.expr;
    if (expression) *expression = expr;
    std::vector<BuildRoute> routes;
    const BuildRoute defaults = BuildRoute::defaults(llm::llmSpace());
    routes.push_back(defaults);
    if (policy.expr.empty()) {
        for (const auto& r : expandRouteExpression(expr, targetSpace(policy.target), policy.seed).routes) {
            BuildRoute full = BuildRoute::parse(r.text(), llm::llmSpace());
            if (!(full == defaults)) routes.push_back(full);
        }
        return routes;
    }
    for (const auto& r : expandRouteExpression(expr, llm::llmSpace(), policy.seed).routes) {
        llm::checkLlmRouteTarget(r, policy.target, "--expr");
        if (!(r == defaults)) routes.push_back(r);
    }
    return routes;
}

LlmTuneResult tuneLlm(const LlmTunePolicy& policy, const std::function<std::unique_ptr<llm::LanguageModel>(const BuildRoute&)>& load,
                      const std::function<void(size_t, size_t)>& progress) {
    check(policy.objective == "tpot" || policy.objective == "ttft" || policy.objective == "throughput", "--objective for an LLM: tpot, ttft or throughput");
    check(policy.rounds > 0, "--rounds must be positive");
    LlmTuneResult result;
    result.objective = policy.objective;
    for (auto& route : planLlmTune(policy, &result.expression)) {
        LlmCandidate c;
        c.changes = route.changesText(llm::llmSpace());
        c.route = std::move(route);
        c.samples.resize(policy.rounds);
        result.candidates.push_back(std::move(c));
    }
    auto& cands = result.candidates;
    std::vector<std::vector<std::vector<int64_t>>> tokens(cands.size());
    std::unique_ptr<llm::LanguageModel> model;
    std::string model_key = "\x01";  // none loaded
    LlmWorkload warmup = policy.workload;
    warmup.requests = std::min<int64_t>(warmup.requests, warmup.concurrency);
    warmup.output_len = std::min<int64_t>(warmup.output_len, 4);
    const size_t total = cands.size() * static_cast<size_t>(policy.rounds);
    size_t done = 0;
    for (int round = 0; round < policy.rounds; ++round) {
        for (size_t k = 0; k < cands.size(); ++k, ++done) {
            // Each round starts one further along, so drift lands on every candidate alike.
            LlmCandidate& c = cands[(k + static_cast<size_t>(round)) % cands.size()];
            const size_t i = static_cast<size_t>(&c - cands.data());
            if (!c.rejected.empty()) continue;
            try {
                const auto typed = llm::llmRuntimeOptions(c.route);
                llm::SchedulerOptions s;  // batch size and cache blocks: the workload's
                s.block_size = typed.block_size;
                s.max_num_tokens = typed.max_num_tokens;
                if (loadKey(c.route) != model_key) {
                    model.reset();  // one model resident at a time
                    model = load(c.route);
                    model_key = loadKey(c.route);
                    runLlmWorkload(*model, s, warmup);  // lazy loads and graph captures
                }
                const LlmRun run = runLlmWorkload(*model, s, policy.workload);
                if (round == 0) tokens[i] = run.tokens;
                c.samples[round] = objectiveSamples(run, policy.objective);
            } catch (const Error& e) {
                check(i != 0, [&] { return std::string("the default LLM route failed: ") + e.what(); });
                c.rejected = std::string("failed: ") + e.what();
                model.reset();
                model_key = "\x01";
            }
            if (progress) progress(done + 1, total);
        }
    }
    // Noise: the default's round medians spread wider than --max-spread. (Its samples within a
    // round are requests at different places in the batch, unlike each other by design.)
    std::vector<double> round_medians;
    for (const auto& r : cands[0].samples)
        if (!r.empty()) round_medians.push_back(medianOf(r));
    if (round_medians.size() > 1) {
        const auto [lo, hi] = std::minmax_element(round_medians.begin(), round_medians.end());
        const double spread = (*hi - *lo) / std::max(medianOf(round_medians), 1e-12);
        if (spread > policy.max_spread) result.noise = "the default's round medians spread " + std::to_string(static_cast<int>(spread * 100)) + "%";
    }
    if (result.noise.empty()) result.noise = machineLoad();
    int best = 0;
    for (size_t i = 0; i < cands.size(); ++i) {
        LlmCandidate& c = cands[i];
        std::vector<double> all;
        for (const auto& r : c.samples) all.insert(all.end(), r.begin(), r.end());
        c.median_ms = all.empty() ? 0 : medianOf(all);
        if (!c.rejected.empty()) continue;
        c.agreement = tokenAgreement(tokens[0], tokens[i]);
        c.speedup = i == 0 ? Interval{} : speedupInterval(cands[0].samples, c.samples, 0.95, 1000, policy.seed + 1);
        if (c.agreement < policy.min_agreement) {
            c.rejected = "greedy tokens agree " + std::to_string(static_cast<int>(c.agreement * 100)) + "% with the default's, below --min-token-agreement";
            continue;
        }
        if (i > 0 && c.speedup.low > 1 + policy.min_gain && (best == 0 || c.speedup.estimate > cands[best].speedup.estimate)) best = static_cast<int>(i);
    }
    // Ties go to the simplest route: any significant candidate as fast as the best's interval allows.
    if (best > 0)
        for (size_t i = 1; i < cands.size(); ++i) {
            const LlmCandidate& c = cands[i];
            if (c.rejected.empty() && c.speedup.low > 1 + policy.min_gain && c.speedup.estimate >= cands[best].speedup.low &&
                changeCount(c.route) < changeCount(cands[best].route))
                best = static_cast<int>(i);
        }
    result.significant = best > 0 && result.noise.empty();
    result.winner = result.significant ? best : 0;
    return result;
}

}  // namespace kiln
