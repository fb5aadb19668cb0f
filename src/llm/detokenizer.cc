#include "llm/detokenizer.h"

#include "llm/utf8.h"

namespace kiln::llm {

std::string IncrementalDetokenizer::decodeWindow() const {
    return tokenizer_->decode(std::vector<int64_t>(tokens_.begin() + static_cast<std::ptrdiff_t>(window_), tokens_.end()));
}

namespace {

std::vector<int64_t> withoutSpecial(const Tokenizer& t, std::span<const int64_t> ids) {
    std::vector<int64_t> out;
    for (int64_t id : ids)
        if (!t.isSpecial(id)) out.push_back(id);
    return out;
}

}  // namespace

std::string IncrementalDetokenizer::add(std::span<const int64_t> tokens) {
    if (!tokenizer_) return {};
    const std::vector<int64_t> text_tokens = withoutSpecial(*tokenizer_, tokens);
    if (text_tokens.empty()) return {};
    tokens_.insert(tokens_.end(), text_tokens.begin(), text_tokens.end());
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
    return tokenizer ? sanitizeUtf8(tokenizer->decode(withoutSpecial(*tokenizer, tokens))) : std::string();
}

}  // namespace kiln::llm
