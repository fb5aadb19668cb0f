// What the LLM commands share: loading a model folder (and its tokenizer when present)
// and parsing token lists.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ir/error.h"
#include "llm/tokenizer.h"
#include "llm/language_model.h"
#include "llm/scheduler.h"

namespace kiln::tools {

struct LoadedLlm {
    std::unique_ptr<llm::LanguageModel> model;
    std::shared_ptr<llm::Tokenizer> tokenizer;  // null without tokenizer.json / tokenizer.model
};

struct LlmTarget {
    std::string device = "cpu";  // cpu (f32 reference decoder) or cuda (f16 GPU decoder)
    int tp = 1;                  // tensor-parallel shards
    std::string route;           // llm.* parameters (llm/llm_parameters.h)
    const CLI::App* command = nullptr;  // where the options were given, to tell flags from defaults
};

// Loads with the route's GPU decoder options.
LoadedLlm loadLlm(const std::string& dir, const LlmTarget& target = {});
// Registers --target, --tp and --route on an LLM command.
void addLlmTargetOption(CLI::App& cmd, LlmTarget& target);
// The route's scheduler settings (llm.block_size, llm.max_num_tokens) over `options`, which
// hold the flags' values; a route that changes a setting whose flag was also given is an Error.
void applyLlmRoute(const LlmTarget& target, llm::SchedulerOptions& options);
std::vector<int64_t> parseTokenList(const std::string& text, const std::string& flag);

}  // namespace kiln::tools
