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

namespace kiln::tools {

struct LoadedLlm {
    std::unique_ptr<llm::LanguageModel> model;
    std::shared_ptr<llm::Tokenizer> tokenizer;  // null without tokenizer.json / tokenizer.model
};

struct LlmTarget {
    std::string device = "cpu";  // cpu (f32 reference decoder) or cuda (f16 GPU decoder)
    int tp = 1;                  // tensor-parallel shards
};

LoadedLlm loadLlm(const std::string& dir, const LlmTarget& target = {});
// Registers --target and --tp on an LLM command.
void addLlmTargetOption(CLI::App& cmd, LlmTarget& target);
std::vector<int64_t> parseTokenList(const std::string& text, const std::string& flag);

}  // namespace kiln::tools
