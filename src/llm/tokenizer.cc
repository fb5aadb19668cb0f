#include "llm/tokenizer.h"

#include "ir/error.h"
#include "llm/bpe_tokenizer.h"

namespace kiln::llm {

std::shared_ptr<Tokenizer> loadTokenizer(const std::filesystem::path& dir) {
    if (std::filesystem::exists(dir / "tokenizer.json")) return std::make_shared<BpeTokenizer>(BpeTokenizer::load(dir / "tokenizer.json"));
    // Debian's libsentencepiece carries protobuf code generated for another protobuf
    // version than the one ONNX links, and refuses to run beside it: a reader of our own
    // is needed before tokenizer.model files can be used.
    check(!std::filesystem::exists(dir / "tokenizer.model"),
          (dir / "tokenizer.model").string() + ": SentencePiece tokenizers are not supported yet; pass token ids (--tokens, or a list as 'prompt')");
    return nullptr;
}

}  // namespace kiln::llm
