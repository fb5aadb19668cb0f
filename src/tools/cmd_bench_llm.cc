// `kiln bench-llm MODEL_DIR`: a serving benchmark on the in-process LLM runtime, in the
// manner of trtllm-bench and vLLM's serving benchmark: requests arrive at a fixed or
// Poisson rate under a concurrency limit; reports time to first token, time per output
// token, inter-token latency, request throughput and output tokens/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "llm/scheduler.h"
#include "tools/commands.h"
#include "tools/llm_common.h"

namespace kiln::tools {

namespace {

struct BenchLlmOptions {
    std::string model;
    LlmTarget target;
    int64_t requests = 32, concurrency = 8, input_len = 32, output_len = 16;
    double rate = 0;  // requests/s, Poisson; 0 = all at once
    llm::SchedulerOptions scheduler;
    uint64_t seed = 0;
    bool json = false;
};

nlohmann::json summary(std::vector<double> v) {
    if (v.empty()) return {{"mean", 0}, {"median", 0}, {"p99", 0}};
    std::sort(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5))]; };
    return {{"mean", sum / static_cast<double>(v.size())}, {"median", pct(50)}, {"p99", pct(99)}};
}

void execute(BenchLlmOptions& o) {
    check(o.requests > 0 && o.concurrency > 0 && o.input_len > 0 && o.output_len > 0 && o.rate >= 0, "--requests, --concurrency, --input-len, --output-len must be positive, --rate >= 0");
    applyLlmRoute(o.target, o.scheduler);
    const LoadedLlm m = loadLlm(o.model, o.target);
    llm::Scheduler sched(*m.model, o.scheduler);
    std::mt19937_64 rng(o.seed);
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto now_ms = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - start).count(); };
    std::vector<double> arrival(o.requests, 0.0);
    std::exponential_distribution<double> gap(o.rate > 0 ? o.rate : 1.0);
    for (int64_t i = 1; i < o.requests; ++i) arrival[i] = o.rate > 0 ? arrival[i - 1] + 1000.0 * gap(rng) : 0.0;
    std::map<int64_t, int64_t> request_of;  // scheduler id -> request index
    std::vector<std::vector<double>> token_ms(o.requests);
    std::vector<double> started(o.requests, 0.0);
    sched.on_token = [&](int64_t id, int64_t) { token_ms[request_of.at(id)].push_back(now_ms()); };
    int64_t next = 0, in_flight = 0, done = 0;
    double max_util = 0;
    int64_t max_blocks = 0;
    std::vector<int64_t> ids;
    while (done < o.requests) {
        while (next < o.requests && in_flight < o.concurrency && arrival[next] <= now_ms()) {
            llm::Request r;
            for (int64_t k = 0; k < o.input_len; ++k) r.prompt.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(m.model->config().vocab)));
            r.max_tokens = o.output_len;
            r.ignore_eos = true;  // fixed output lengths, as vLLM's benchmark runs
            started[next] = now_ms();
            const int64_t id = sched.add(r);
            request_of[id] = next++;
            ids.push_back(id);
            ++in_flight;
        }
        if (!sched.step()) {
            if (next < o.requests && in_flight == 0) continue;  // waiting for the next arrival
        }
        const auto kv = sched.cache().stats();
        max_util = std::max(max_util, kv.utilization);
        max_blocks = std::max(max_blocks, kv.blocks_used);
        in_flight = 0;
        done = 0;
        for (int64_t id : ids) (sched.state(id).finished == llm::FinishReason::None ? in_flight : done) += 1;
    }
    const double total_s = now_ms() / 1000.0;
    std::vector<double> ttft, tpot, itl, e2e;
    int64_t output_tokens = 0;
    for (int64_t i = 0; i < o.requests; ++i) {
        const auto& t = token_ms[i];
        output_tokens += static_cast<int64_t>(t.size());
        if (t.empty()) continue;
        ttft.push_back(t.front() - started[i]);
        e2e.push_back(t.back() - started[i]);
        if (t.size() > 1) tpot.push_back((t.back() - t.front()) / static_cast<double>(t.size() - 1));
        for (size_t k = 1; k < t.size(); ++k) itl.push_back(t[k] - t[k - 1]);
    }
    nlohmann::json j = {{"model", o.model},
                        {"device", m.model->device()},
                        {"requests", o.requests},
                        {"concurrency", o.concurrency},
                        {"rate_per_s", o.rate},
                        {"input_len", o.input_len},
                        {"output_len", o.output_len},
                        {"duration_s", total_s},
                        {"request_throughput_per_s", static_cast<double>(o.requests) / total_s},
                        {"output_tokens_per_s", static_cast<double>(output_tokens) / total_s},
                        {"ttft_ms", summary(ttft)},
                        {"tpot_ms", summary(tpot)},
                        {"itl_ms", summary(itl)},
                        {"e2e_ms", summary(e2e)},
                        {"kv_cache", {{"max_blocks_used", max_blocks}, {"blocks_total", o.scheduler.num_blocks}, {"max_utilization", max_util}}}};
    if (o.json) {
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        return;
    }
    std::printf("%lld requests in %.2f s: %.2f requests/s, %.1f output tokens/s\n", static_cast<long long>(o.requests), total_s,
                j["request_throughput_per_s"].get<double>(), j["output_tokens_per_s"].get<double>());
    for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"})
        std::printf("%-8s mean %9.2f  median %9.2f  p99 %9.2f\n", k, j[k]["mean"].get<double>(), j[k]["median"].get<double>(), j[k]["p99"].get<double>());
    std::printf("KV cache: up to %lld of %lld blocks, utilization up to %.0f%%\n", static_cast<long long>(max_blocks), static_cast<long long>(o.scheduler.num_blocks),
                100 * max_util);
}

}  // namespace

void addBenchLlmCommand(CLI::App& app) {
    auto o = std::make_shared<BenchLlmOptions>();
    CLI::App* cmd = app.add_subcommand("bench-llm", "Serving benchmark of the LLM runtime: TTFT, TPOT, inter-token latency, throughput");
    cmd->add_option("model", o->model, "Model folder (config.json, model.safetensors or its shards)")->required();
    addLlmTargetOption(*cmd, o->target);
    cmd->add_option("--requests", o->requests, "Number of requests");
    cmd->add_option("--concurrency", o->concurrency, "Requests in flight at most");
    cmd->add_option("--rate", o->rate, "Arrival rate in requests/s (Poisson); 0 = all at once");
    cmd->add_option("--input-len", o->input_len, "Prompt tokens per request (random ids)");
    cmd->add_option("--output-len", o->output_len, "Generated tokens per request");
    cmd->add_option("--max-batch-size", o->scheduler.max_batch_size, "Sequences per step");
    cmd->add_option("--max-num-tokens", o->scheduler.max_num_tokens, "Tokens per step (chunked prefill budget)");
    cmd->add_option("--block-size", o->scheduler.block_size, "KV cache block size in tokens");
    cmd->add_option("--num-blocks", o->scheduler.num_blocks, "KV cache blocks");
    cmd->add_option("--seed", o->seed, "Seed for prompts and arrivals");
    cmd->add_flag("--json", o->json, "Machine-readable results");
    cmd->callback([o] { execute(*o); });
}

}  // namespace kiln::tools
