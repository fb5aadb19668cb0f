// Text <-> token ids: byte-level BPE from tokenizer.json (GPT-2 style) and SentencePiece
// from tokenizer.model (Llama style).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace kiln::llm {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;
    virtual std::vector<int64_t> encode(const std::string& text) const = 0;
    virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
    virtual int64_t vocabSize() const = 0;
};

// The tokenizer of a Hugging Face model folder: tokenizer.json (byte-level BPE) when
// present, else tokenizer.model (SentencePiece); nullptr when it has neither.
std::shared_ptr<Tokenizer> loadTokenizer(const std::filesystem::path& dir);

}  // namespace kiln::llm
