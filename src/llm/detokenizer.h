// Streamed text from streamed tokens. Decoding each new token alone is wrong twice over: a
// token may end inside a UTF-8 character (byte-level BPE splits emoji and CJK characters),
// and some tokenizers decode a token differently at the start of a text (SentencePiece
// drops the leading space). Like vLLM and TGI, this keeps a window of recent tokens, decodes
// the window, and hands out only the bytes that are new and form whole characters.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llm/tokenizer.h"

namespace kiln::llm {

class IncrementalDetokenizer {
public:
    // With no tokenizer every call returns "" (clients read token ids instead).
    explicit IncrementalDetokenizer(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
    // Adds generated tokens; returns the text they complete: valid UTF-8, possibly empty
    // while a character waits for its last bytes.
    std::string add(std::span<const int64_t> tokens);
    // The held-back rest, with an incomplete last character as U+FFFD. Call once, at the end.
    std::string finish();

private:
    std::string decodeWindow() const;
    const Tokenizer* tokenizer_;
    std::vector<int64_t> tokens_;
    size_t window_ = 0;   // first token of the decoded window
    size_t emitted_ = 0;  // bytes of the window's text already handed out
};

// The text of a whole completion, with invalid bytes as U+FFFD ("" without a tokenizer).
// Both leave special tokens out of the text (their ids still reach clients as token ids).
std::string decodeText(const Tokenizer* tokenizer, const std::vector<int64_t>& tokens);

}  // namespace kiln::llm
