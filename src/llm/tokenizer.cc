#include "llm/tokenizer.h"

#include "ir/error.h"
#include "llm/bpe_tokenizer.h"
#include "llm/sentencepiece_tokenizer.h"

namespace kiln::llm {

std::shared_ptr<Tokenizer> loadTokenizer(const std::filesystem::path& dir) {
    // Llama-style folders ship both files; their tokenizer.json is not byte-level BPE, so the
    // SentencePiece model, when present, is the one to trust.
    if (std::filesystem::exists(dir / "tokenizer.model"))
        return std::make_shared<SentencePieceTokenizer>(SentencePieceTokenizer::load(dir / "tokenizer.model"));
    if (std::filesystem::exists(dir / "tokenizer.json")) return std::make_shared<BpeTokenizer>(BpeTokenizer::load(dir / "tokenizer.json"));
    return nullptr;
}

}  // namespace kiln::llm
