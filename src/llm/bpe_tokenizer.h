// Byte-level BPE (GPT-2 family) from a Hugging Face tokenizer.json: text is split into
// words (GPT-2's pre-tokenization rules, with non-ASCII bytes treated as letters), each
// word's bytes are mapped to GPT-2's printable byte alphabet and merged by rank.
#pragma once
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "llm/tokenizer.h"

namespace kiln::llm {

class BpeTokenizer : public Tokenizer {
public:
    static BpeTokenizer load(const std::filesystem::path& tokenizer_json);
    static BpeTokenizer parse(const std::string& json_text, const std::string& where);
    std::vector<int64_t> encode(const std::string& text) const override;
    std::string decode(const std::vector<int64_t>& ids) const override;
    int64_t vocabSize() const override { return static_cast<int64_t>(id_to_token_.size()); }
    size_t maxTokenBytes() const override { return max_token_bytes_; }
    bool isSpecial(int64_t id) const override { return special_.count(id) != 0; }

private:
    static BpeTokenizer parseJson(const nlohmann::json& j, const std::string& where);
    std::vector<std::string> splitWords(const std::string& text) const;
    std::vector<int64_t> encodeWord(const std::string& word) const;
    std::unordered_map<std::string, int64_t> vocab_;
    std::vector<std::string> id_to_token_;
    std::map<std::pair<std::string, std::string>, int64_t> ranks_;
    std::vector<std::pair<std::string, int64_t>> added_;  // special tokens matched verbatim
    std::string byte_to_char_[256];
    std::unordered_map<std::string, unsigned char> char_to_byte_;
    size_t max_token_bytes_ = 1;
    std::set<int64_t> special_;  // added tokens marked "special"
};

}  // namespace kiln::llm
