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
    // The bytes the ids stand for; they need not be valid UTF-8 (a token may hold part of a
    // character: see detokenizer.h). Ids the tokenizer has no piece for decode as U+FFFD.
    virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
    virtual int64_t vocabSize() const = 0;
    // The most text bytes one token can stand for (0: no bound), so that a prompt too long
    // for the context can be refused before tokenizing it.
    virtual size_t maxTokenBytes() const { return 0; }
    // Special tokens (end-of-text, chat markers): generated text leaves them out, as
    // Hugging Face's decode(skip_special_tokens=True) and vLLM do.
    virtual bool isSpecial(int64_t id) const { return false; }
};

// The tokenizer of a Hugging Face model folder: tokenizer.json (byte-level BPE) when
// present, else tokenizer.model (SentencePiece); nullptr when it has neither.
std::shared_ptr<Tokenizer> loadTokenizer(const std::filesystem::path& dir);

}  // namespace kiln::llm
