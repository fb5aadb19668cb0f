// What the LLM commands share: loading a model folder (and its tokenizer when present)
// and parsing token lists.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llm/tokenizer.h"
#include "llm/decoder_model.h"

namespace kiln::tools {

struct LoadedLlm {
    std::unique_ptr<llm::DecoderModel> model;
    std::shared_ptr<llm::Tokenizer> tokenizer;  // null without tokenizer.json / tokenizer.model
};

LoadedLlm loadLlm(const std::string& dir);
std::vector<int64_t> parseTokenList(const std::string& text, const std::string& flag);

}  // namespace kiln::tools
