// `kiln generate MODEL_DIR`: text (or token) generation with the LLM runtime, streamed.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "llm/detokenizer.h"
#include "llm/scheduler.h"
#include "tools/commands.h"
#include "tools/llm_common.h"

namespace kiln::tools {

namespace {

struct GenerateOptions {
    std::string model, prompt, tokens;
    LlmTarget target;
    llm::Request request;
    bool json = false;
};

void execute(GenerateOptions& o) {
    namespace fs = std::filesystem;
    const LoadedLlm m = loadLlm(o.model, o.target);
    check(o.prompt.empty() != o.tokens.empty(), "give exactly one of --prompt and --tokens");
    if (!o.prompt.empty()) {
        check(m.tokenizer != nullptr, o.model + ": no tokenizer.json or tokenizer.model; pass --tokens instead of --prompt");
        o.request.prompt = m.tokenizer->encode(o.prompt);
    } else {
        o.request.prompt = parseTokenList(o.tokens, "--tokens");
    }
    llm::SchedulerOptions scheduler;
    applyLlmRoute(o.target, scheduler);
    llm::Scheduler sched(*m.model, scheduler);
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    std::vector<double> token_times;
    llm::IncrementalDetokenizer text(m.tokenizer.get());
    sched.on_token = [&](int64_t, int64_t token) {
        token_times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        if (!o.json && m.tokenizer) {
            std::cout << text.add(std::vector<int64_t>{token}) << std::flush;
        } else if (!o.json) {
            std::cout << token << " " << std::flush;
        }
    };
    const int64_t id = sched.add(o.request);
    sched.runToCompletion();
    const llm::RequestState& s = sched.state(id);
    const char* reasons[] = {"none", "length", "stop", "cancelled", "context_length"};
    const double total = token_times.empty() ? 0.0 : token_times.back();
    const double tpot = token_times.size() > 1 ? (token_times.back() - token_times.front()) / static_cast<double>(token_times.size() - 1) : 0.0;
    if (o.json) {
        nlohmann::json j = {{"prompt_tokens", o.request.prompt.size()}, {"output_tokens", s.output}, {"finish_reason", reasons[static_cast<int>(s.finished)]},
                            {"ttft_ms", token_times.empty() ? 0.0 : token_times.front()}, {"tpot_ms", tpot},
                            {"output_tokens_per_s", total > 0 ? 1000.0 * static_cast<double>(s.output.size()) / total : 0.0}};
        if (m.tokenizer) j["text"] = llm::decodeText(m.tokenizer.get(), s.output);
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        std::cout << text.finish() << "\n";
        std::fprintf(stderr, "%zu prompt + %zu generated tokens, finish: %s, first token %.1f ms, %.2f ms/token\n", o.request.prompt.size(), s.output.size(),
                     reasons[static_cast<int>(s.finished)], token_times.empty() ? 0.0 : token_times.front(), tpot);
    }
}

}  // namespace

void addGenerateCommand(CLI::App& app) {
    auto o = std::make_shared<GenerateOptions>();
    CLI::App* cmd = app.add_subcommand("generate", "Generate text with a decoder model (Hugging Face folder: config.json, model.safetensors or its shards, tokenizer.json)");
    cmd->add_option("model", o->model, "Model folder")->required();
    addLlmTargetOption(*cmd, o->target);
    cmd->add_option("--prompt", o->prompt, "Prompt text (needs tokenizer.json)");
    cmd->add_option("--tokens", o->tokens, "Prompt as token ids: 1,2,3");
    cmd->add_option("--max-tokens", o->request.max_tokens, "Tokens to generate at most");
    cmd->add_option("--temperature", o->request.sampling.temperature, "0 = greedy");
    cmd->add_option("--top-k", o->request.sampling.top_k, "Sample from the k most likely tokens (0 = all)");
    cmd->add_option("--top-p", o->request.sampling.top_p, "Nucleus sampling mass");
    cmd->add_option("--repetition-penalty", o->request.sampling.repetition_penalty, "> 1 discourages repeats");
    cmd->add_option("--seed", o->request.sampling.seed, "Sampling seed");
    cmd->add_option("--stop-token", o->request.stop_tokens, "Token ids that end generation (repeatable)");
    cmd->add_flag("--ignore-eos", o->request.ignore_eos, "Do not stop at the model's end-of-sequence ids (eos_token_id)");
    cmd->add_flag("--json", o->json, "Print the result as JSON instead of streaming text");
    cmd->callback([o] { execute(*o); });
}

}  // namespace kiln::tools
