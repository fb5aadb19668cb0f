#include "llm/detokenizer.h"

#include "llm/utf8.h"

namespace kiln::llm {

std::string IncrementalDetokenizer::decodeWindow() const {
    return tokenizer_->decode(std::vector<int64_t>(tokens_.begin() + static_cast<std::ptrdiff_t>(window_), tokens_.end()));
}

std::string IncrementalDetokenizer::add(std::span<const int64_t> tokens) {
    if (!tokenizer_ || tokens.empty()) return {};
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    const std::string text = decodeWindow();
    const size_t complete = completeUtf8Prefix(text);
    std::string out = complete > emitted_ ? sanitizeUtf8(std::string_view(text).substr(emitted_, complete - emitted_)) : std::string();
    emitted_ = std::max(emitted_, complete);
    if (complete == text.size()) {
        // Nothing held back: the window restarts at the last token, which stays as context
        // so that the next token decodes as it would inside the text.
        window_ = tokens_.size() - 1;
        emitted_ = decodeWindow().size();
    }
    return out;
}

std::string IncrementalDetokenizer::finish() {
    if (!tokenizer_ || tokens_.empty()) return {};
    const std::string text = decodeWindow();
    std::string out = emitted_ < text.size() ? sanitizeUtf8(std::string_view(text).substr(emitted_)) : std::string();
    emitted_ = text.size();
    return out;
}

std::string decodeText(const Tokenizer* tokenizer, const std::vector<int64_t>& tokens) {
    return tokenizer ? sanitizeUtf8(tokenizer->decode(tokens)) : std::string();
}

}  // namespace kiln::llm
