// Text <-> token ids. Implementation so far: byte-level BPE from tokenizer.json (GPT-2
// style); SentencePiece (tokenizer.model, Llama style) is still to come.
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

// The tokenizer of a Hugging Face model folder (tokenizer.json); nullptr when it has none.
// A folder with only tokenizer.model (SentencePiece) is an Error saying so.
std::shared_ptr<Tokenizer> loadTokenizer(const std::filesystem::path& dir);

}  // namespace kiln::llm
